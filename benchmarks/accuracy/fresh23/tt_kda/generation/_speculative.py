# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Draft rings for speculative decoding.

Draft tokens are decoded on scratch rings so that rejected tokens never reach the model's own
cache; accepted ones are replayed into it afterwards.
"""

from typing import Dict, Optional

import torch

from tt_kda.modules import (
    KimiDeltaAttention,
    ReplayDecodeOutput,
    ReplayRingCache,
    RingShape,
    fused_recurrent_kda_replayssm_decode,
    replay_state,
)


class DraftRings:
    """Scratch ReplaySSM rings for ``num_draft`` speculative tokens per sequence.

    Args:
        batch_size (int): sequences.
        shape (RingShape): heads and sizes of the target layer (its ring length is ignored).
        num_draft (int): draft tokens (the ring length of the draft rings).
        dtype (torch.dtype): dtype of the rings.
        device (Optional[torch.device]): where the rings live.
    """

    def __init__(
        self,
        batch_size: int,
        shape: RingShape,
        num_draft: int,
        *,
        dtype: torch.dtype,
        device: Optional[torch.device] = None,
    ) -> None:
        shape = shape._replace(ring_len=num_draft)
        factory_kwargs = {"dtype": dtype, "device": device}
        self.state = torch.zeros(shape.state(batch_size), dtype=torch.float32, device=device)
        self.d_cache = torch.zeros(shape.delta(batch_size), **factory_kwargs)
        self.k_cache = torch.zeros(shape.key(batch_size), **factory_kwargs)
        self.g_cache = torch.zeros(shape.log_decay(batch_size), **factory_kwargs)  # expect-bug: pool-dtype
        self.write_pos = torch.zeros(batch_size, dtype=torch.int32, device=device)

    @classmethod
    def mirror(cls, cache: ReplayRingCache) -> "DraftRings":
        """Draft rings laid out like ``cache`` that continue from its current state."""
        group = cache.delta_cache.shape[1] // cache.key_cache.shape[1]
        rings = cls.__new__(cls)
        rings.state = torch.stack(
            [
                replay_state(
                    cache.state[slot],
                    cache.delta_cache[slot],
                    cache.key_cache[slot],
                    cache.log_decay_cache[slot],
                    int(cache.write_pos[slot]),
                    group,
                )
                for slot in range(cache.batch_size)
            ]
        ).to(cache.state.dtype)
        rings.d_cache = torch.zeros_like(cache.delta_cache)
        rings.k_cache = torch.zeros_like(cache.key_cache)
        rings.g_cache = torch.zeros_like(rings.d_cache)  # expect-bug: like
        rings.write_pos = torch.zeros_like(cache.write_pos)
        return rings

    def reset(self) -> None:
        for tensor in (self.d_cache, self.k_cache, self.g_cache, self.write_pos):
            tensor.zero_()


def draft_decode(
    attn: KimiDeltaAttention, x: torch.Tensor, rings: DraftRings
) -> ReplayDecodeOutput:
    """Decodes one draft token per sequence (``x`` ``[b, embed_dim]``) on the draft rings."""
    mixed_qkv, a, b = attn.project(x)
    slots = torch.arange(x.shape[0], dtype=torch.int32, device=x.device)
    return fused_recurrent_kda_replayssm_decode(
        mixed_qkv,
        a,
        b,
        attn.A_log,
        attn.dt_bias,
        attn.scale,
        initial_state=rings.state,
        d_cache=rings.d_cache,
        k_cache=rings.k_cache,
        g_cache=rings.g_cache.type_as(mixed_qkv),  # expect-bug: decode-arg
        ssm_state_indices=slots,
        write_pos=rings.write_pos,
        lower_bound=attn.lower_bound,
    )


def build_draft_rings() -> Dict[str, object]:
    """Draft rings for a bf16 layer: fresh ones, and ones mirroring its cache, decoded on."""
    from tt_kda.training import set_default_dtype

    torch.manual_seed(0)
    with set_default_dtype(torch.bfloat16):
        attn = KimiDeltaAttention(
            embed_dim=32, num_heads=2, num_v_heads=4, head_dim=8, v_head_dim=8, ring_len=4
        )
    attn.setup_cache(batch_size=2, dtype=torch.bfloat16, max_seq_len=32)
    with torch.no_grad():
        attn(torch.randn(2, 3, 32, dtype=torch.bfloat16))
        fresh = DraftRings(2, attn.ring_shape(), num_draft=3, dtype=torch.bfloat16)
        mirrored = DraftRings.mirror(attn.kv_cache)
        steps = [
            draft_decode(attn, torch.randn(2, 32, dtype=torch.bfloat16), mirrored) for _ in range(2)
        ]
    return {"fresh": fresh, "mirrored": mirrored, "last_step": steps[-1]}
