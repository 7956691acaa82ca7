"""Kimi Linear language model: a stack of KDA layers (cf. megatron/core/models/mamba/mamba_model.py)."""

import os
from dataclasses import dataclass
from typing import Dict, Optional, Union

import torch

from mcore_kda.core.dist_checkpointing.mapping import ShardedStateDict, ShardedTensor, inference_buffer_dtype
from mcore_kda.core.ssm.kda_mixer import KDAMixer
from mcore_kda.core.tensor_parallel import ColumnParallelLinear, VocabParallelEmbedding
from mcore_kda.core.transformer.module import Float16Module, MegatronModule
from mcore_kda.core.transformer.spec_utils import ModuleSpec, build_module
from mcore_kda.core.transformer.transformer_config import TransformerConfig

_REPLAY_BUFFER_NAMES = ("ssm_state", "delta_ring", "key_ring", "gate_ring")


@dataclass
class KDAStackSubmodules:
    kda_layer: Union[ModuleSpec, type] = None
    final_norm: Union[ModuleSpec, type] = None


class KDAStack(MegatronModule):
    """The decoder: ``num_layers`` KDA layers and a final norm."""

    def __init__(self, config: TransformerConfig, submodules: KDAStackSubmodules, post_process: bool = True):
        super().__init__(config)
        self.post_process = post_process
        self.layers = torch.nn.ModuleList(
            [build_module(submodules.kda_layer, config, layer_number=i + 1) for i in range(config.num_layers)]
        )
        if post_process:
            self.final_norm = build_module(submodules.final_norm, config, config.hidden_size, eps=config.layernorm_epsilon)

    def forward(self, hidden_states: torch.Tensor, inference_context=None) -> torch.Tensor:
        for layer in self.layers:
            hidden_states = layer(hidden_states, inference_context=inference_context)
        if self.post_process:
            hidden_states = self.final_norm(hidden_states)
        return hidden_states


class KimiLinearModel(MegatronModule):
    """Kimi Linear language model.

    Args:
        config (TransformerConfig): Transformer config
        kda_stack_spec (ModuleSpec): Specifies the modules of the KDA stack
        vocab_size (int): Vocabulary size
        max_sequence_length (int): maximum size of sequence. This is used for positional embedding
        pre_process (bool, optional): Include embedding layer (used with pipeline parallelism).
        post_process (bool, optional): Include an output layer (used with pipeline parallelism).
    """

    def __init__(
        self,
        config: TransformerConfig,
        kda_stack_spec: ModuleSpec,
        vocab_size: int,
        max_sequence_length: int,
        pre_process: bool = True,
        post_process: bool = True,
    ):
        super().__init__(config)
        self.vocab_size = vocab_size
        self.max_sequence_length = max_sequence_length
        self.pre_process = pre_process
        self.post_process = post_process
        if pre_process:
            self.embedding = VocabParallelEmbedding(
                vocab_size, config.hidden_size, init_method=config.init_method, config=config
            )
        self.decoder = build_module(kda_stack_spec, config=config, post_process=post_process)
        if post_process:
            self.output_layer = ColumnParallelLinear(
                config.hidden_size, vocab_size, config=config, init_method=config.init_method,
                bias=False, gather_output=True,
            )

    def forward(self, input_ids, position_ids=None, attention_mask=None, inference_context=None):
        """input_ids [b, s] -> logits [b, s, vocab]"""
        hidden_states = self.embedding(input_ids).transpose(0, 1).contiguous()
        hidden_states = self.decoder(hidden_states, inference_context=inference_context)
        logits, _ = self.output_layer(hidden_states)
        return logits.transpose(0, 1).contiguous()

    def kda_mixers(self) -> Dict[int, KDAMixer]:
        return {layer.layer_number: layer.mixer for layer in self.decoder.layers if isinstance(layer.mixer, KDAMixer)}

    def allocate_inference_cache(self, batch_size: int, max_seqlen: int, dtype: Optional[torch.dtype] = None):
        """Static decode buffers of every KDA layer, keyed by layer number."""
        return {
            layer_number: mixer.allocate_inference_cache(batch_size, max_seqlen, dtype=dtype)
            for layer_number, mixer in self.kda_mixers().items()
        }

    # ---- resident decode state --------------------------------------------------------

    def replay_buffer_state_dict(self) -> Dict[str, torch.Tensor]:
        """The resident decode buffers (non-persistent: absent from ``state_dict``)."""
        state = {}
        for name, module in self.named_modules():
            for buffer_name in _REPLAY_BUFFER_NAMES:
                buffer = module._buffers.get(buffer_name)
                if buffer is not None:
                    state[f"{name}.{buffer_name}"] = buffer.detach()
        return state

    def replay_buffer_sharded_state_dict(self, prefix: str = "") -> ShardedStateDict:
        return {
            key: ShardedTensor.from_rank_offsets(f"{prefix}replay.{key}", tensor, replica_id=0)
            for key, tensor in self.replay_buffer_state_dict().items()
        }

    def copy_replay_buffers_(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Load saved resident buffers in place (same batch size; every buffer keeps its dtype)."""
        with torch.no_grad():
            for key, tensor in state_dict.items():
                self.get_buffer(key).copy_(tensor)

    def load_replay_buffers(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Re-register the resident buffers from saved ones (whose batch size may differ)."""
        for name, module in self.named_modules():
            for buffer_name in _REPLAY_BUFFER_NAMES:
                key = f"{name}.{buffer_name}"
                if key not in state_dict:
                    continue
                dtype = inference_buffer_dtype(key, self.config)  # expect-bug: imported-policy id=buffer-policy
                module.register_buffer(buffer_name, state_dict[key].to(dtype=dtype), persistent=False)


def kimi_linear_tiny_config(**overrides) -> TransformerConfig:
    """A Kimi-Linear-shaped config small enough for CPU tests (H=2, HV=4, K=8, V=4, L=4)."""
    settings = dict(
        num_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=4,
        kda_ring_length=4,
        init_method_std=0.2,
    )
    settings.update(overrides)
    if settings.get("bf16"):
        settings.setdefault("params_dtype", torch.bfloat16)
    if settings.get("fp16"):
        settings.setdefault("params_dtype", torch.float16)
    return TransformerConfig(**settings)


def kimi_linear_model_provider(config: TransformerConfig, vocab_size: int = 32, pre_process=True, post_process=True):
    """Builds the model (in ``config.params_dtype``; Float16Module casts it for bf16/fp16 serving)."""
    from .kimi_linear_layer_specs import kimi_linear_stack_spec

    return KimiLinearModel(
        config=config,
        kda_stack_spec=kimi_linear_stack_spec,
        vocab_size=vocab_size,
        max_sequence_length=64,
        pre_process=pre_process,
        post_process=post_process,
    )


def build_float16_module_bf16():
    """bf16 serving through Float16Module with resident decode state: the gate ring stays fp32."""
    from mcore_kda.core.inference.engines.static_engine import make_static_engine

    torch.manual_seed(0)
    config = kimi_linear_tiny_config(
        bf16=True, kda_gate_lower_bound=-5.0, kda_resident_inference_state=True, inference_max_batch_size=2
    )
    model = Float16Module(config, kimi_linear_model_provider(config))
    engine = make_static_engine(model, max_batch_size=2)
    tokens = engine.generate([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]], num_tokens_to_generate=4)
    return {"model": model, "tokens": tokens, "write_pos": engine.inference_context.kda_write_pos}


def build_reloaded_replay_buffers(tmp_dir):
    """Save the resident decode state of a bf16 server and reload it into a restarted one."""
    from mcore_kda.core.inference.engines.static_engine import make_static_engine

    torch.manual_seed(0)
    config = kimi_linear_tiny_config(
        bf16=True, kda_gate_lower_bound=-5.0, kda_state_dtype="fp32", kda_resident_inference_state=True,
        inference_max_batch_size=2,
    )
    model = Float16Module(config, kimi_linear_model_provider(config))
    engine = make_static_engine(model, max_batch_size=2)
    tokens = engine.generate([[9, 9, 2, 4, 1, 7], [3, 3, 3, 1, 0, 2]], num_tokens_to_generate=3)
    path = os.path.join(tmp_dir, "replay_buffers.pt")
    torch.save(model.module.replay_buffer_state_dict(), path)
    restarted = Float16Module(config, kimi_linear_model_provider(config))
    restarted.module.load_replay_buffers(torch.load(path, map_location="cpu", weights_only=True))
    return {"model": restarted, "tokens": tokens}
