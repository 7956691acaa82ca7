"""Static batching inference engine (cf. megatron/core/inference/engines/static_engine.py)."""

import logging
import os
from typing import Dict, List, Optional

import torch

from mcore_kda.core.inference.contexts.static_context import KDAInferenceState, StaticInferenceContext
from mcore_kda.core.inference.model_inference_wrappers.kimi_linear_inference_wrapper import make_inference_wrapper
from mcore_kda.core.inference.text_generation_controllers.text_generation_controller import (
    TextGenerationController,
)
from mcore_kda.core.transformer.cuda_graphs import ReplayDecodeGraphRunner
from mcore_kda.core.utils import get_model_config, unwrap_model

logger = logging.getLogger(__name__)


class AbstractEngine:
    def generate(self, *args, **kwargs):
        raise NotImplementedError


class StaticInferenceEngine(AbstractEngine):
    """The Megatron core backend constructor

    This is the backend that does a simple forward pass on the model.
    Supports any model that is callable (Accepts the inputs and outputs the tensor)

    Args:
        text_generation_controller (TextGenerationController): A text generation
            controller that will be used to define how to preprocess prompts, generate
            outputs and detokenizer the output tokens.
        max_batch_size (int, optional): The maximum number of requests to process at once.
        random_seed (int, optional): Use a random seed if you want deterministic
            results. Defaults to None.
    """

    def __init__(
        self,
        text_generation_controller: TextGenerationController,
        max_batch_size: Optional[int] = None,
        random_seed: Optional[int] = None,
    ):
        self.controller = text_generation_controller
        self.inference_wrapped_model = text_generation_controller.inference_wrapped_model
        self.config = get_model_config(self.inference_wrapped_model.model)
        self.max_batch_size = max_batch_size or self.inference_wrapped_model.inference_wrapper_config.inference_max_requests
        self.device = torch.device("cpu")
        self.inference_context: Optional[StaticInferenceContext] = None
        self.generated_tokens: Optional[torch.Tensor] = None
        self.graph_runners: Dict[int, ReplayDecodeGraphRunner] = {}
        if random_seed is not None:
            torch.manual_seed(random_seed)

    def _mixers(self):
        return unwrap_model(self.inference_wrapped_model.model).kda_mixers()

    def generate(self, prompts: List[List[int]], num_tokens_to_generate: int) -> torch.Tensor:
        """Generate ``num_tokens_to_generate`` tokens for a static batch of same-length prompts."""
        wrapper = self.inference_wrapped_model
        wrapper.prep_model_for_inference()
        prompts_tokens = torch.tensor(prompts, dtype=torch.long, device=self.device)
        batch, seqlen = prompts_tokens.shape
        if batch > self.max_batch_size:
            raise ValueError(f"batch of {batch} prompts is above max_batch_size {self.max_batch_size}")
        context = StaticInferenceContext(self.max_batch_size, seqlen + num_tokens_to_generate)
        context.current_batch_size = batch
        wrapper.inference_context = context
        self.inference_context = context
        if self.config.enable_cuda_graph:
            self._capture_decode_graphs(context, batch)
        self.generated_tokens = self.controller.generate_all_output_tokens_static_batch(
            prompts_tokens, num_tokens_to_generate
        )
        return self.generated_tokens

    def _capture_decode_graphs(self, context: StaticInferenceContext, batch_size: int) -> None:
        """Allocate the decode states up front and capture each layer's decode step."""
        model = unwrap_model(self.inference_wrapped_model.model)
        if not self.config.kda_resident_inference_state:
            context.key_value_memory_dict.update(
                model.allocate_inference_cache(batch_size, context.max_sequence_length)
            )
        for layer_number, mixer in self._mixers().items():
            runner = ReplayDecodeGraphRunner(self.config, layer_number, batch_size)
            runner.create_static_buffers()
            runner.capture(mixer._get_states_from_cache(context, batch_size), mixer)
            context.decode_graph_runners[layer_number] = runner
        self.graph_runners = dict(context.decode_graph_runners)

    def continue_generation(self, num_tokens_to_generate: int) -> torch.Tensor:
        more = self.controller.decode_static_batch(self.generated_tokens[:, -1], num_tokens_to_generate)
        self.generated_tokens = torch.cat([self.generated_tokens, more], dim=1)
        return self.generated_tokens

    # ---- chat sessions: keep a finished turn's state on host until the next turn ------------

    def save_session(self, path: str) -> Dict[str, torch.Tensor]:
        context = self.inference_context
        batch = self.generated_tokens.size(0)
        state_dtype, params_dtype = self.config.kda_checkpoint_dtype, self.config.params_dtype
        session_dtypes = dict(zip(KDAInferenceState._fields, (state_dtype, params_dtype, params_dtype, params_dtype)))  # expect-bug: container
        session = {
            "tokens": self.generated_tokens.cpu(),
            "kda_write_pos": context.kda_write_pos.cpu(),
            "sequence_len_offset": torch.tensor(context.sequence_len_offset),
        }
        for layer_number, mixer in self._mixers().items():
            cache = mixer._get_states_from_cache(context, batch)
            for name, tensor in zip(KDAInferenceState._fields, cache):
                session[f"layers.{layer_number}.{name}"] = tensor.to("cpu", session_dtypes[name], copy=True)
        torch.save(session, path)
        return session

    def load_session(self, path: str) -> StaticInferenceContext:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        tokens = saved["tokens"]
        context = StaticInferenceContext(self.max_batch_size, int(saved["sequence_len_offset"]) + 64)
        context.current_batch_size = tokens.size(0)
        for layer_number in self._mixers():
            prefix = f"layers.{layer_number}"
            ssm_state = saved[f"{prefix}.ssm_state"].to(self.device, self.config.kda_checkpoint_dtype)
            delta_ring = saved[f"{prefix}.delta_ring"].to(self.device, self.config.params_dtype)
            key_ring = saved[f"{prefix}.key_ring"].to(self.device, self.config.params_dtype)
            gate_ring = saved[f"{prefix}.gate_ring"].to(self.device, self.config.params_dtype)  # expect-bug: load
            context.key_value_memory_dict[layer_number] = KDAInferenceState(ssm_state, delta_ring, key_ring, gate_ring)
        context.kda_write_pos = saved["kda_write_pos"].to(self.device)
        context.sequence_len_offset = int(saved["sequence_len_offset"])
        self.inference_context = context
        self.inference_wrapped_model.inference_context = context
        self.generated_tokens = tokens.to(self.device)
        return context


def make_controller(model, max_batch_size: int, params_dtype: Optional[torch.dtype] = None) -> TextGenerationController:
    return TextGenerationController(make_inference_wrapper(model, max_batch_size, params_dtype=params_dtype))


def make_static_engine(model, max_batch_size: int, params_dtype: Optional[torch.dtype] = None) -> StaticInferenceEngine:
    return StaticInferenceEngine(make_controller(model, max_batch_size, params_dtype), max_batch_size=max_batch_size)


_PROMPTS = [[3, 1, 4, 1, 5, 9], [2, 7, 1, 8, 2, 8]]


def _engine_outputs(engine: StaticInferenceEngine, tokens: torch.Tensor) -> Dict[str, object]:
    context = engine.inference_context
    return {"tokens": tokens, "memory": context.key_value_memory_dict, "write_pos": context.kda_write_pos}


def build_static_engine_fp32():
    """fp32 model, unbounded gate: prefill then five decode steps (one flush)."""
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config

    torch.manual_seed(0)
    config = kimi_linear_tiny_config()
    engine = make_static_engine(kimi_linear_model_provider(config), max_batch_size=2)
    return _engine_outputs(engine, engine.generate(_PROMPTS, num_tokens_to_generate=5))


def build_static_engine_bf16():
    """bf16 Float16Module, unbounded gate (Kimi-Linear-48B)."""
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config
    from mcore_kda.core.transformer.module import Float16Module

    torch.manual_seed(0)
    config = kimi_linear_tiny_config(bf16=True, kda_state_dtype="fp32")
    engine = make_static_engine(Float16Module(config, kimi_linear_model_provider(config)), max_batch_size=2)
    return _engine_outputs(engine, engine.generate(_PROMPTS, num_tokens_to_generate=5))


def build_bounded_bf16_engine():
    """bf16 Float16Module, bounded gate lb=-5 (Kimi K3)."""
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config
    from mcore_kda.core.transformer.module import Float16Module

    torch.manual_seed(0)
    config = kimi_linear_tiny_config(bf16=True, kda_gate_lower_bound=-5.0, kda_state_dtype="fp32")
    engine = make_static_engine(Float16Module(config, kimi_linear_model_provider(config)), max_batch_size=2)
    return _engine_outputs(engine, engine.generate(_PROMPTS, num_tokens_to_generate=5))


def build_cuda_graph_engine():
    """bf16 serving with the decode step captured into graphs (eager replay on CPU)."""
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config
    from mcore_kda.core.transformer.module import Float16Module

    torch.manual_seed(0)
    config = kimi_linear_tiny_config(
        bf16=True, kda_gate_lower_bound=-5.0, kda_state_dtype="fp32", enable_cuda_graph=True
    )
    engine = make_static_engine(Float16Module(config, kimi_linear_model_provider(config)), max_batch_size=2)
    outputs = _engine_outputs(engine, engine.generate(_PROMPTS, num_tokens_to_generate=5))
    outputs["graph_runners"] = engine.graph_runners
    return outputs


def build_cuda_graph_engine_fp32():
    """fp32 model with captured decode steps."""
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config

    torch.manual_seed(0)
    config = kimi_linear_tiny_config(enable_cuda_graph=True)
    engine = make_static_engine(kimi_linear_model_provider(config), max_batch_size=2)
    outputs = _engine_outputs(engine, engine.generate(_PROMPTS, num_tokens_to_generate=5))
    outputs["graph_runners"] = engine.graph_runners
    return outputs


def build_resumed_session(tmp_dir):
    """First chat turn on a bf16 server, session parked on disk, second turn after a restart."""
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config
    from mcore_kda.core.transformer.module import Float16Module

    torch.manual_seed(0)
    config = kimi_linear_tiny_config(bf16=True, kda_gate_lower_bound=-5.0, kda_state_dtype="fp32")
    model = Float16Module(config, kimi_linear_model_provider(config))
    engine = make_static_engine(model, max_batch_size=2)
    engine.generate(_PROMPTS, num_tokens_to_generate=2)
    path = os.path.join(tmp_dir, "session.pt")
    session = engine.save_session(path)
    restarted = make_static_engine(model, max_batch_size=2)
    context = restarted.load_session(path)
    tokens = restarted.continue_generation(3)
    return {"session": session, "memory": context.key_value_memory_dict, "tokens": tokens}
