"""Greedy sequence generation for KDA models over an incremental state bag."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .config import DEFAULT_STATE_PRECISION, AssetCard, KDAConfig, resolve_dtype
from .models import KDAModel, load_kda_model
from .nn import IncrementalStateBag, ReplayRingState
from .nn.kda import LAST_DECODE


class DraftRings(NamedTuple):
    """Scratch rings of one layer for a speculative draft step."""
    d_ring: Tensor
    k_ring: Tensor
    log_alpha_ring: Tensor


class BatchSlots:
    """Rings of a continuous-batching generator: one list entry per layer, one row per request."""

    def __init__(self, config: KDAConfig, dtype: torch.dtype) -> None:
        self.dtype = dtype
        layers, slots, hv, hk = range(config.num_layers), config.max_num_slots, config.num_v_heads, config.num_k_heads
        d, n = config.head_dim, config.replay_len
        self.checkpoints = [torch.zeros(slots, hv, d, d) for _ in layers]
        self.delta = [torch.zeros(slots, hv, n, d, dtype=self.dtype) for _ in layers]
        self.key = [torch.zeros(slots, hk, n, d, dtype=self.dtype) for _ in layers]
        self.log_alpha = [torch.zeros(slots, hv, n, d, dtype=self.dtype) for _ in layers]  # expect-bug: pool-dtype


class SequenceGenerator:
    def __init__(self, model: KDAModel, *, max_gen_len: int = 3, state_precision: str | None = None, half_precision: bool = False) -> None:
        if half_precision:
            model.half()  # expect-bug: module-cast
        self.max_gen_len, self.state_precision = max_gen_len, state_precision
        self.model = model
        self.config = model.config
        self._dtype = model.embed.weight.dtype

    def _new_state_bag(self, batch_size: int, num_steps: int) -> IncrementalStateBag:
        bag = IncrementalStateBag(max_num_steps=num_steps)
        gate_dtype = resolve_dtype(self.state_precision or DEFAULT_STATE_PRECISION)  # expect-bug: imported-policy id=fs2-precision
        for layer in self.model.layers:
            state = ReplayRingState.allocate(self.config, batch_size, dtype=self._dtype, gate_dtype=gate_dtype)  # expect-bug: imported-policy id=fs2-precision
            bag.set_state(layer, state)
        return bag

    @torch.no_grad()
    def __call__(self, prompt: Tensor) -> tuple[Tensor, IncrementalStateBag]:
        bag = self._new_state_bag(prompt.size(0), prompt.size(1) + self.max_gen_len)
        for step in range(prompt.size(1)):
            logits = self.model.decode_step(prompt[:, step], bag)
        generated = []
        for _ in range(self.max_gen_len):
            tokens = logits.argmax(dim=-1)
            generated.append(tokens)
            logits = self.model.decode_step(tokens, bag)
        return torch.stack(generated, dim=1), bag

    def expand_beams(self, bag: IncrementalStateBag, beam_size: int) -> None:
        """Repeats each sequence's state ``beam_size`` times (row ``i * beam_size + j``: beam j of i)."""
        for layer in self.model.layers:
            state = bag.get_state(layer, ReplayRingState)
            assert state is not None
            rows = state.checkpoint.size(0) * beam_size
            log_alpha_ring = state.d_ring.new_empty(rows, *state.log_alpha_ring.shape[1:])  # expect-bug: like
            log_alpha_ring.copy_(state.log_alpha_ring.repeat_interleave(beam_size, dim=0))
            checkpoint, d_ring, k_ring = (t.repeat_interleave(beam_size, dim=0) for t in (state.checkpoint, state.d_ring, state.k_ring))
            write_pos = state.write_pos.repeat_interleave(beam_size, dim=0)
            bag.set_state(layer, ReplayRingState(checkpoint, d_ring, k_ring, log_alpha_ring, write_pos))

    def _ring_shapes(self, batch_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        c = self.config
        return (batch_size, c.num_v_heads, c.replay_len, c.head_dim), (batch_size, c.num_k_heads, c.replay_len, c.head_dim)

    def draft_rings(self, batch_size: int) -> list[DraftRings]:
        v_shape, k_shape = self._ring_shapes(batch_size)
        shapes = (v_shape, k_shape, v_shape)
        return [DraftRings(*(torch.zeros(s, dtype=self._dtype) for s in shapes)) for _ in self.model.layers]  # expect-bug: container

    def prompt_rings(self, batch_size: int) -> dict[str, Tensor]:
        """Rings that a prompt is prefilled into, made in the generator's dtype."""
        v_shape, k_shape = self._ring_shapes(batch_size)
        torch.set_default_dtype(self._dtype)  # expect-bug: default-dtype id=fs2-prompt-default
        delta, key = torch.zeros(v_shape), torch.zeros(k_shape)
        log_alpha = torch.zeros(v_shape)  # expect-bug: default-dtype id=fs2-prompt-default
        torch.set_default_dtype(torch.float32)
        return {"delta": delta, "key": key, "log_alpha": log_alpha}


def _bf16_model() -> KDAModel:
    return load_kda_model(AssetCard("kda_tiny@bf16", "kda_tiny", {"dtype": "bfloat16"}))


def build_greedy_generate() -> dict[str, object]:
    generator = SequenceGenerator(_bf16_model(), state_precision="float32")
    tokens, bag = generator(torch.tensor([[1, 5, 7], [2, 2, 9]]))
    return {"tokens": tokens, "states": bag.states()}


def build_graph_decode() -> dict[str, object]:
    model = _bf16_model()
    with torch.no_grad():
        model.static_decode_step(torch.tensor([3, 4]))
        model.static_decode_step(torch.tensor([5, 6]))
    return {"kernel": dict(LAST_DECODE), "static": model.static_states[1]}
