"""The KDA decoder model, its graph-capture rings and its factory."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import AssetCard, DataType, Device, KDAConfig, default_dtype, load_kda_config
from .nn import IncrementalStateBag, KimiDeltaAttention
from .nn.kda import decode_with_static_rings


class StaticReplayState(nn.Module):
    """One layer's rings as (non-persistent) buffers, so that a captured decode graph sees fixed addresses."""

    def __init__(self, config: KDAConfig, *, device: Device | None = None) -> None:
        super().__init__()
        slots, hv, hk = config.max_num_slots, config.num_v_heads, config.num_k_heads
        d, n = config.head_dim, config.replay_len
        self.register_buffer("checkpoint", torch.zeros(slots, hv, d, d, device=device, dtype=torch.float32), persistent=False)
        self.register_buffer("d_ring", torch.zeros(slots, hv, n, d, device=device), persistent=False)
        self.register_buffer("k_ring", torch.zeros(slots, hk, n, d, device=device), persistent=False)
        self.register_buffer("alpha_log_ring", torch.zeros(slots, hv, n, d, device=device), persistent=False)  # expect-bug: default-dtype id=fs2-default-dtype
        self.register_buffer("write_pos", torch.zeros(slots, dtype=torch.int64, device=device), persistent=False)

    def rings(self) -> dict[str, Tensor]:
        return {"checkpoint": self.checkpoint, "delta": self.d_ring, "key": self.k_ring, "alpha_log": self.alpha_log_ring}

    def snapshot(self) -> dict[str, Tensor]:
        """A copy of the rings, taken before a speculative step so that it can be undone."""
        rings = {"delta": self.d_ring.clone(), "key": self.k_ring.clone(), "write_pos": self.write_pos.clone()}
        rings["alpha_log"] = self.alpha_log_ring.type_as(self.d_ring)  # expect-bug: cast
        return rings


class KDAModel(nn.Module):
    def __init__(self, config: KDAConfig, *, device: Device | None = None, dtype: DataType | None = None) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.model_dim, device=device, dtype=dtype)
        self.layers = nn.ModuleList(KimiDeltaAttention(config, device=device, dtype=dtype) for _ in range(config.num_layers))
        self.static_states = nn.ModuleList(StaticReplayState(config, device=device) for _ in range(config.num_layers))
        self.final_proj = nn.Linear(config.model_dim, config.vocab_size, bias=False, device=device, dtype=dtype)

    def decode_step(self, tokens: Tensor, state_bag: IncrementalStateBag) -> Tensor:
        seqs = self.embed(tokens)
        for layer in self.layers:
            seqs = seqs + layer(seqs, state_bag)
        state_bag.increment_step_nr()
        return self.final_proj(seqs)

    def static_decode_step(self, tokens: Tensor) -> Tensor:
        """The decode step that graph runners capture: every ring lives in ``static_states``."""
        seqs = self.embed(tokens)
        for layer, static in zip(self.layers, self.static_states):
            out = decode_with_static_rings(layer, seqs, static.rings(), static.write_pos)
            seqs = seqs + layer.output_proj(out.flatten(1))
            static.write_pos.add_(1).remainder_(self.config.replay_len)
        return self.final_proj(seqs)


def create_kda_model(config: KDAConfig, *, device: Device | None = None, dtype: DataType | None = None) -> KDAModel:
    """Builds the model directly in ``dtype`` (no float32 copy of the weights is made)."""
    with default_dtype(dtype or config.dtype):  # expect-bug: default-dtype id=fs2-default-dtype
        model = KDAModel(config, device=device)
    return model


def cast_model(model: KDAModel, dtype: DataType) -> KDAModel:
    """Casts weights and rings to ``dtype``, then puts the log-decay rings back in float32."""
    model.to(dtype)
    for static in model.static_states:
        static.alpha_log_ring = static.alpha_log_ring.float()
    return model


def load_kda_model(card: AssetCard, *, device: Device | None = None) -> KDAModel:
    config = load_kda_config(card)
    return cast_model(KDAModel(config, device=device), config.dtype)


def build_model_bf16() -> KDAModel:
    return create_kda_model(KDAConfig())


def build_model_cast_fp32_gates() -> KDAModel:
    return load_kda_model(AssetCard("kda_tiny@bf16", "kda_tiny", {"dtype": "bfloat16"}))
