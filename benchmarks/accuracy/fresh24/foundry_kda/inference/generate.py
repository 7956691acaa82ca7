# Copyright 2024 foundry_kda authors
# SPDX-License-Identifier: Apache-2.0

"""Generation with ReplaySSM decode caches.

* :class:`InferenceWrapper` serves a model with caches of its own (Composer's eval loop and
  :func:`hf_generate`).
* :class:`BatchedReplayGenerator` decodes against a shared :class:`ReplayCachePool`, calling
  the decode kernel directly, one call per layer.
* :class:`DraftReplayPool` and :class:`SpeculativeVerifier` support speculative decoding: the
  draft model's caches, and verification on forks of the target's caches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from foundry_kda.inference.cache_pool import (
    TINY_REPLAY_SPEC,
    LayerRings,
    ReplayCachePool,
    StaticReplayCache,
    randomize_,
)
from foundry_kda.models.kimi_linear import KimiLinearConfig, KimiLinearForCausalLM
from foundry_kda.models.replayssm import fused_recurrent_kda_replayssm_decode, replay_state
from foundry_kda.precision import (
    Precision,
    RingDtypes,
    get_model_dtype,
    get_precision_context,
    ring_dtypes_for,
    ring_storage_dtype,
    to_precision,
)

__all__ = [
    "BatchedReplayGenerator",
    "DraftReplayPool",
    "GenerateOutput",
    "InferenceWrapper",
    "SpeculativeVerifier",
    "hf_generate",
]


class InferenceWrapper(nn.Module):
    """Serves a causal LM with slot-indexed replay caches owned by the wrapper.

    Args:
        model: A model with ``replay_spec()`` and ``decode_step()``.
        precision: Precision the caches are made for.
        num_slots: Number of sequences decoded together.
        ring_len: Ring length of the caches.
        ring_dtypes: Storage dtypes of the caches; derived from ``precision`` when omitted.
    """

    def __init__(
        self,
        model: KimiLinearForCausalLM,
        precision: str | Precision = Precision.AMP_BF16,
        num_slots: int = 1,
        ring_len: int = 4,
        ring_dtypes: RingDtypes | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.precision = to_precision(precision)
        spec = model.replay_spec()
        ring_dtype = ring_dtypes.delta if ring_dtypes is not None else get_model_dtype(self.precision)
        gate_dtype = (
            ring_dtypes.gate if ring_dtypes is not None else ring_storage_dtype(self.precision, "gate")
        )  # expect-bug: imported-policy id=ring-storage
        self.caches = nn.ModuleList(
            StaticReplayCache(spec, num_slots, ring_len, dtype=ring_dtype, gate_dtype=gate_dtype)
            for _ in range(spec.num_layers)
        )

    @torch.no_grad()
    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Next-token logits for ``batch["input_ids"] [N]`` in ``batch["slots"] [N]``."""
        input_ids = batch["input_ids"]
        slots = batch.get("slots")
        if slots is None:
            slots = torch.arange(input_ids.shape[0], device=input_ids.device)
        return self.model.decode_step(input_ids, slots, caches=list(self.caches))

    @torch.no_grad()
    def prefill(self, prompts: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Feeds ``prompts [N, T]`` token by token; returns the logits after the last one."""
        logits = None
        for t in range(prompts.shape[1]):
            logits = self({"input_ids": prompts[:, t], "slots": slots})
        if logits is None:
            raise ValueError("empty prompts")
        return logits


class GenerateOutput(NamedTuple):
    sequences: torch.Tensor
    wrapper: InferenceWrapper


@torch.no_grad()
def hf_generate(
    model: KimiLinearForCausalLM,
    input_ids: torch.Tensor,
    max_new_tokens: int = 4,
    precision: str | Precision = Precision.AMP_BF16,
    ring_len: int = 4,
    ring_dtypes: RingDtypes | None = None,
) -> GenerateOutput:
    """Greedy generation in the spirit of ``transformers.GenerationMixin.generate``.

    Returns the prompt followed by the generated tokens, and the wrapper with its caches.
    """
    precision = to_precision(precision)
    wrapper = InferenceWrapper(
        model,
        precision,
        num_slots=input_ids.shape[0],
        ring_len=ring_len,
        ring_dtypes=ring_dtypes or ring_dtypes_for(precision),
    )
    if precision is Precision.AMP_FP16:
        # fp16 autocast pays a cast per projection on the decode path; serve half weights instead.
        wrapper.half()  # expect-bug: module-cast
        context: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    else:
        context = get_precision_context(precision)
    slots = torch.arange(input_ids.shape[0])
    generated = [input_ids]
    with context:
        logits = wrapper.prefill(input_ids, slots)
        for _ in range(max_new_tokens):
            tokens = logits.float().argmax(dim=-1)
            generated.append(tokens.unsqueeze(1))
            logits = wrapper({"input_ids": tokens, "slots": slots})
    return GenerateOutput(torch.cat(generated, dim=1), wrapper)


class BatchedReplayGenerator:
    """Greedy decoding of many sequences against a shared :class:`ReplayCachePool`.

    Runs the blocks of ``model`` itself and calls the decode kernel once per layer for the
    whole batch, which is what the serving engine does between scheduler steps.
    """

    def __init__(self, model: KimiLinearForCausalLM, pool: ReplayCachePool) -> None:
        self.model = model
        self.pool = pool

    @torch.no_grad()
    def step(self, token_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        model = self.model
        hidden = model.embed_tokens(token_ids)
        for block, rings in zip(model.blocks, self.pool.layers, strict=True):
            attn = block.attn
            mixed_qkv, a, b = attn.project(block.attn_norm(hidden))
            result = fused_recurrent_kda_replayssm_decode(
                mixed_qkv=mixed_qkv,
                a=a,
                b=b,
                A_log=attn.A_log,
                dt_bias=attn.dt_bias,
                scale=attn.scale,
                initial_state=rings.state,
                d_cache=rings.d_cache,
                k_cache=rings.k_cache,
                g_cache=rings.g_cache.type_as(mixed_qkv),
                ssm_state_indices=slots,
                write_pos=rings.write_pos,
                lower_bound=attn.lower_bound,
            )  # expect-bug: decode-arg
            rings.d_cache, rings.k_cache, rings.g_cache = result[1:4]
            hidden = hidden + attn.o_proj(result.out.flatten(1).to(hidden.dtype))
            hidden = hidden + block.mlp(block.mlp_norm(hidden))
        return model.lm_head(model.norm(hidden))

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, slots: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        logits = None
        for t in range(prompts.shape[1]):
            logits = self.step(prompts[:, t], slots)
        assert logits is not None
        tokens = []
        for _ in range(max_new_tokens):
            next_tokens = logits.float().argmax(dim=-1)
            tokens.append(next_tokens)
            logits = self.step(next_tokens, slots)
        return torch.stack(tokens, dim=1)


class DraftReplayPool:
    """Replay caches of the (small) draft model of speculative decoding.

    The draft's caches are short-lived and cheap, so they are kept in the draft's dtype.
    """

    def __init__(
        self, spec: Any, num_slots: int, ring_len: int, cache_dtype: torch.dtype = torch.bfloat16
    ) -> None:
        self.spec = spec
        self.cache_dtype = cache_dtype
        self.layers: list[LayerRings] = []
        for _ in range(spec.num_layers):
            shapes = spec.ring_shapes(num_slots, ring_len)
            rings: dict[str, torch.Tensor] = {"state": torch.zeros(shapes.pop("state"), dtype=torch.float32)}
            for name, shape in shapes.items():
                rings[name] = torch.zeros(shape, dtype=self.cache_dtype)  # expect-bug: pool-dtype
            rings["write_pos"] = torch.zeros(num_slots, dtype=torch.int32)
            self.layers.append(LayerRings(**rings))


class SpeculativeVerifier:
    """Verifies draft tokens on forks of the target's caches and commits the forks on acceptance.

    A fork starts from a flushed cache: the slot's ring is folded into a fresh checkpoint and
    the fork's rings are empty, so that rejected steps never touch the target pool.
    """

    def __init__(self, model: KimiLinearForCausalLM, target: ReplayCachePool) -> None:
        self.model = model
        self.target = target

    @torch.no_grad()
    def fork(self, slots: Sequence[int]) -> list[LayerRings]:
        index = torch.as_tensor(list(slots), dtype=torch.long)
        group = self.target.spec.num_v_heads // self.target.spec.num_k_heads
        forks = []
        for rings in self.target.layers:
            checkpoints = [
                replay_state(
                    rings.state[s],
                    rings.d_cache[s],
                    rings.k_cache[s].repeat_interleave(group, dim=0),
                    rings.g_cache[s],
                    int(rings.write_pos[s]),
                )
                for s in index.tolist()
            ]
            d_cache = torch.zeros_like(rings.d_cache[index])
            k_cache = torch.zeros_like(rings.k_cache[index])
            g_cache = torch.zeros_like(d_cache)  # expect-bug: like
            forks.append(
                LayerRings(
                    torch.stack(checkpoints),
                    d_cache,
                    k_cache,
                    g_cache,
                    torch.zeros_like(rings.write_pos[index]),
                )
            )
        return forks

    @torch.no_grad()
    def verify(self, forks: list[LayerRings], draft_tokens: torch.Tensor) -> torch.Tensor:
        """Target logits ``[N, T, vocab]`` for ``draft_tokens [N, T]`` run on ``forks``."""
        slots = torch.arange(draft_tokens.shape[0])
        logits = [
            self.model.decode_step(draft_tokens[:, t], slots, caches=forks)
            for t in range(draft_tokens.shape[1])
        ]
        return torch.stack(logits, dim=1)

    @torch.no_grad()
    def commit(self, forks: list[LayerRings], slots: Sequence[int]) -> None:
        """Replaces the target's caches of ``slots`` by the forks (dtypes of the pool kept)."""
        index = torch.as_tensor(list(slots), dtype=torch.long)
        for rings, fork in zip(self.target.layers, forks, strict=True):
            for name, tensor in rings.items():
                tensor.index_copy_(0, index, getattr(fork, name).to(tensor.dtype))


def build_hf_generate_bf16() -> dict[str, object]:
    """Greedy generation of four tokens for two prompts under amp_bf16 autocast."""
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(KimiLinearConfig())
    prompts = torch.tensor([[1, 5, 9], [2, 4, 8]])
    output = hf_generate(model, prompts, max_new_tokens=4, precision="amp_bf16")
    return {"sequences": output.sequences, "caches": output.wrapper.caches}


def build_hf_generate_fp16() -> dict[str, object]:
    """Greedy generation with fp16 weights and caches (fp16 serving)."""
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(KimiLinearConfig())
    prompts = torch.tensor([[1, 5, 9], [2, 4, 8]])
    output = hf_generate(model, prompts, max_new_tokens=3, precision=Precision.AMP_FP16)
    return {"sequences": output.sequences, "wrapper": output.wrapper}


def build_batched_generator() -> dict[str, object]:
    """Batched decoding on a bf16 pool, and an eval wrapper with default cache dtypes."""
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(KimiLinearConfig()).to(torch.bfloat16)
    pool = ReplayCachePool(
        model.replay_spec(), num_slots=3, ring_len=4, ring_dtypes=ring_dtypes_for("amp_bf16")
    )
    generator = BatchedReplayGenerator(model, pool)
    tokens = generator.generate(torch.tensor([[1, 2], [3, 4]]), torch.tensor([2, 0]), max_new_tokens=3)
    wrapper = InferenceWrapper(model, "amp_bf16", num_slots=2)
    wrapper.prefill(torch.tensor([[5, 6]]).expand(2, 2), torch.tensor([0, 1]))
    return {"tokens": tokens, "pool": pool.layers, "eval_caches": wrapper.caches}


def build_speculative_draft() -> dict[str, object]:
    """Draft caches, and forks of a bf16 target pool verified on two draft tokens and committed."""
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(KimiLinearConfig()).to(torch.bfloat16)
    draft = DraftReplayPool(TINY_REPLAY_SPEC, num_slots=2, ring_len=4, cache_dtype=torch.bfloat16)
    target = randomize_(ReplayCachePool(TINY_REPLAY_SPEC, 3, 4, ring_dtypes=ring_dtypes_for("amp_bf16")))
    verifier = SpeculativeVerifier(model, target)
    forks = verifier.fork([0, 2])
    logits = verifier.verify(forks, torch.tensor([[3, 1], [4, 1]]))
    verifier.commit(forks, [0, 2])
    return {"draft": draft.layers, "forks": forks, "target": target.layers, "logits": logits}
