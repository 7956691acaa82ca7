"""Inference wrapper of Kimi Linear models (cf. gpt_inference_wrapper.py)."""

import abc
from typing import Any, Dict, Optional

import torch

from mcore_kda.core.inference.contexts.base_context import BaseInferenceContext
from mcore_kda.core.utils import get_model_config, get_model_dtype

from .inference_wrapper_config import InferenceWrapperConfig


class AbstractModelInferenceWrapper(abc.ABC):
    """Abstract inference wrapper

    Extend this to create a version for your model.

    Args:
        model: The model, wrapped or not (Float16Module)
        inference_wrapper_config: Has info like hidden size, vocab size etc.
        inference_context: Context of the generation (static or dynamic batching).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        inference_wrapper_config: InferenceWrapperConfig,
        inference_context: Optional[BaseInferenceContext] = None,
    ):
        self.model = model
        self.inference_wrapper_config = inference_wrapper_config
        self.inference_context = inference_context
        self.model_is_pipeline_parallel = False
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def prep_model_for_inference(self, prompts_tokens: Optional[torch.Tensor] = None):
        """A utility function for preparing model for inference

        The function gets called once before the auto regressive inference loop.
        It puts the model in eval mode, and serves it in the configured dtype.
        """
        self.model.eval()
        self.model.to(device=self.device)
        model_dtype = get_model_dtype(self.model)
        if model_dtype != self.inference_wrapper_config.params_dtype:
            # e.g. a checkpoint converted from Hugging Face in fp32, served without a Float16Module
            self.model = self.model.to(dtype=self.inference_wrapper_config.params_dtype)  # expect-bug: module-cast

    @abc.abstractmethod
    def prep_inference_input(self, prompts_tokens: torch.Tensor) -> Dict[str, Any]:
        """Prepares the inference input data."""

    def run_one_forward_step(self, inference_input: Dict[str, Any]) -> torch.Tensor:
        """The forward pass of the model for inference: logits [b, s, vocab] in fp32."""
        tokens = inference_input["tokens"]
        position_ids = inference_input.get("position_ids")
        with torch.no_grad():
            logits = self.model(tokens, position_ids, None, inference_context=self.inference_context)
        return logits.float()


class KimiLinearInferenceWrapper(AbstractModelInferenceWrapper):
    """Inference wrapper for Kimi Linear models (no attention mask, no rotary positions)."""

    def prep_inference_input(self, prompts_tokens: torch.Tensor) -> Dict[str, Any]:
        batch, seqlen = prompts_tokens.shape
        position_ids = torch.arange(seqlen, dtype=torch.long, device=prompts_tokens.device).unsqueeze(0)
        return {"tokens": prompts_tokens, "position_ids": position_ids.expand(batch, -1)}


def make_inference_wrapper(model, max_batch_size: int, params_dtype: Optional[torch.dtype] = None):
    config = get_model_config(model)
    wrapper_config = InferenceWrapperConfig(
        hidden_size=config.hidden_size,
        params_dtype=config.params_dtype if params_dtype is None else params_dtype,
        inference_batch_times_seqlen_threshold=512,
        padded_vocab_size=32,
        inference_max_requests=max_batch_size,
    )
    return KimiLinearInferenceWrapper(model, wrapper_config)


def build_fp16_inference_models():
    """Resident-state models served in half precision: one through an fp16 Float16Module, one
    fp32 checkpoint served in bf16 by the wrapper."""
    from mcore_kda.core.inference.engines.static_engine import make_static_engine
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config
    from mcore_kda.core.transformer.module import Float16Module

    torch.manual_seed(0)
    fp16_config = kimi_linear_tiny_config(
        fp16=True, kda_gate_lower_bound=-5.0, kda_resident_inference_state=True, inference_max_batch_size=2
    )
    fp16_model = Float16Module(fp16_config, kimi_linear_model_provider(fp16_config))
    fp16_tokens = make_static_engine(fp16_model, max_batch_size=2).generate([[2, 7, 1, 8, 2, 8]], 3)

    fp32_config = kimi_linear_tiny_config(
        kda_gate_lower_bound=-5.0, kda_resident_inference_state=True, inference_max_batch_size=2
    )
    engine = make_static_engine(kimi_linear_model_provider(fp32_config), 2, params_dtype=torch.bfloat16)
    bf16_tokens = engine.generate([[1, 4, 1, 4, 2, 1]], 3)
    return {"fp16_model": fp16_model, "bf16_model": engine.inference_wrapped_model.model,
            "fp16_tokens": fp16_tokens, "bf16_tokens": bf16_tokens}


def build_bf16_wrapped_model():
    """A bf16 model without resident state (nothing to keep in fp32) served by the wrapper with a
    dynamic context."""
    from mcore_kda.core.inference.contexts.dynamic_context import DynamicInferenceContext
    from mcore_kda.core.inference.engines.static_engine import make_controller
    from mcore_kda.core.inference.inference_state_config import KDAInferenceStateConfig
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config

    torch.manual_seed(0)
    config = kimi_linear_tiny_config(kda_gate_lower_bound=-5.0)
    model = kimi_linear_model_provider(config).bfloat16()
    context = DynamicInferenceContext(
        params_dtype=torch.bfloat16,
        num_layers=config.num_layers,
        max_sequence_length=64,
        max_requests=2,
        kda_inference_state_config=KDAInferenceStateConfig.from_config(config),
    )
    controller = make_controller(model, 2, params_dtype=torch.bfloat16)
    tokens = controller.generate_all_output_tokens_dynamic_batch(context, {0: [5, 5, 1, 2, 9], 1: [8, 1, 3]}, 4)
    return {"model": model, "context": context, "tokens": tokens}
