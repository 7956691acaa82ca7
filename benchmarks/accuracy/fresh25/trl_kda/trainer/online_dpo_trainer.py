# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""Online DPO for KDA models: two fresh completions per prompt, judged, then a DPO step.

Completions come from the colocated engine, or, with ``fork_prompt_rings``, from the policy
itself: the prompt is prefilled once into ReplaySSM rings (it fits in the ring, so the
checkpoint stays zero) and the rings are forked into one beam per completion. The reference
log-probabilities are computed with a full forward pass, or token by token through the decode
kernel (``ref_logps_from_decode``), which is how a served reference model would score them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from trl_kda.accelerate_utils import Accelerator
from trl_kda.extras.colocate_engine import ColocatedEngine, EngineArgs, SamplingParams
from trl_kda.models.modeling_kda import TINY_MODEL_ID, KDAAttention, KDAForCausalLM
from trl_kda.models.replayssm import (
    advance_write_pos,
    fused_recurrent_kda_replayssm_decode,
    l2_normalize,
    split_mixed_qkv,
)
from trl_kda.models.utils import create_reference_model, unwrap_model_for_generation
from trl_kda.trainer.utils import get_torch_dtype, selective_log_softmax

Judge = Callable[[Sequence[int], Sequence[int], Sequence[int]], int]


@dataclass
class OnlineDPOConfig:
    beta: float = 0.1
    loss_type: str = "sigmoid"
    learning_rate: float = 5e-7
    max_new_tokens: int = 3
    temperature: float = 0.9
    model_init_kwargs: dict[str, Any] = field(default_factory=dict)
    use_vllm: bool = True
    vllm_dtype: str = "auto"
    ring_len: int = 4
    fork_prompt_rings: bool = False
    ref_logps_from_decode: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.loss_type not in ("sigmoid", "ipo"):
            raise ValueError(f"loss_type must be 'sigmoid' or 'ipo', got {self.loss_type!r}")
        if not self.use_vllm and not self.fork_prompt_rings:
            raise ValueError("without vLLM, completions are generated from forked prompt rings")


class PromptRings(NamedTuple):
    """One layer's rings after a prompt of ``length`` tokens (``[HV, L, V]``, ``[H, L, K]``, ``[HV, L, K]``)."""

    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    gate_ring: torch.Tensor
    length: int


@dataclass
class BeamRings:
    """One layer's decode state for the beams forked from one prompt."""

    state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    gate_ring: torch.Tensor
    write_pos: torch.Tensor

    @classmethod
    def allocate(cls, prompt: PromptRings, num_beams: int, dtype: torch.dtype) -> BeamRings:
        num_v_heads, _, head_v_dim = prompt.delta_ring.shape
        head_k_dim = prompt.gate_ring.shape[-1]
        shapes = [(num_beams, *ring.shape) for ring in (prompt.delta_ring, prompt.key_ring, prompt.gate_ring)]
        delta_ring, key_ring, gate_ring = (torch.zeros(shape, dtype=dtype) for shape in shapes)  # expect-bug: pool-dtype
        state = torch.zeros(num_beams, num_v_heads, head_v_dim, head_k_dim, dtype=torch.float32)
        write_pos = torch.full((num_beams,), prompt.length, dtype=torch.int32)
        return cls(state, delta_ring, key_ring, gate_ring, write_pos)

    def load_prompt(self, prompt: PromptRings) -> None:
        self.delta_ring.copy_(prompt.delta_ring.expand_as(self.delta_ring))
        self.key_ring.copy_(prompt.key_ring.expand_as(self.key_ring))
        self.gate_ring.copy_(prompt.gate_ring.expand_as(self.gate_ring))
        self.write_pos.fill_(prompt.length)


@dataclass
class RefRings:
    """One layer's single-sequence decode state of the reference model."""

    state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    gate_ring: torch.Tensor
    write_pos: torch.Tensor


def prefer_more_distinct(prompt: Sequence[int], first: Sequence[int], second: Sequence[int]) -> int:
    """A rule-based judge: the completion with more distinct tokens wins (ties: the first)."""
    return 0 if len(set(first)) >= len(set(second)) else 1


class OnlineDPOTrainer:
    def __init__(
        self, model: str | KDAForCausalLM, ref_model: KDAForCausalLM | None = None,
        judge: Judge = prefer_more_distinct, args: OnlineDPOConfig | None = None,
        accelerator: Accelerator | None = None,
    ) -> None:
        self.args = args or OnlineDPOConfig()
        self.accelerator = accelerator or Accelerator()
        if isinstance(model, str):
            kwargs = dict(self.args.model_init_kwargs)
            kwargs["torch_dtype"] = get_torch_dtype(kwargs.get("torch_dtype")) or "auto"
            model = KDAForCausalLM.from_pretrained(model, seed=self.args.seed, **kwargs)
        self.policy = model
        self.model = self.accelerator.prepare(model)
        self.ref_model = ref_model if ref_model is not None else create_reference_model(model)
        self.judge = judge
        self.engine: ColocatedEngine | None = None
        if self.args.use_vllm:
            self.engine = ColocatedEngine(
                model.config,
                EngineArgs(dtype=self.args.vllm_dtype, replay_ring_len=self.args.ring_len, seed=self.args.seed),
            )
        self.prompt_rings: list[PromptRings] = []
        self.beams: list[BeamRings] = []
        self.last_ref_rings: list[RefRings] = []
        self._generator = torch.Generator().manual_seed(self.args.seed)

    # -- prompt rings and beams ----------------------------------------------------------

    def _prompt_gate_ring(self, attn: KDAAttention, a: torch.Tensor) -> torch.Tensor:
        """Log-decays of the prompt rows as a ring ``[HV, L, K]``; rows past the prompt are 0."""
        _, num_v_heads, head_k_dim, _ = attn.geometry()
        steps = a.shape[0]
        x = (a.unflatten(-1, (num_v_heads, head_k_dim)) + attn.dt_bias.view(num_v_heads, head_k_dim).to(a.dtype)).transpose(0, 1)
        if attn.lower_bound is None:
            rows = -attn.A_log.float().exp().view(num_v_heads, 1, 1) * F.softplus(x.float())
        else:
            rows = torch.stack(
                [attn.lower_bound * torch.sigmoid(attn.A_log[h].exp() * x[h]) for h in range(num_v_heads)]
            )  # expect-bug: promotion
        return F.pad(rows, (0, 0, 0, self.args.ring_len - steps))

    @torch.no_grad()
    def prefill_prompt(self, model: KDAForCausalLM, prompt_ids: Sequence[int]) -> tuple[list[PromptRings], torch.Tensor]:
        """Each layer's rings after ``prompt_ids`` (from a zero checkpoint), and the last logits."""
        steps = len(prompt_ids)
        if steps >= self.args.ring_len:
            raise ValueError(f"a prompt of {steps} tokens does not fit a ring of {self.args.ring_len}")
        hidden = model.embed_tokens(torch.tensor(list(prompt_ids)))
        rings: list[PromptRings] = []
        for layer in model.layers:
            attn = layer.attn
            H, HV, K, V = attn.geometry()
            mixed_qkv, a, b = attn.project(layer.attn_norm(hidden))
            q, k, v = split_mixed_qkv(mixed_qkv.float(), H, HV, K, V)
            if attn.use_qk_l2norm:
                q, k = l2_normalize(q), l2_normalize(k)
            q_hv = q.repeat_interleave(HV // H, dim=1) * attn.scale
            k_hv = k.repeat_interleave(HV // H, dim=1)
            gate_ring = self._prompt_gate_ring(attn, a)
            beta = torch.sigmoid(b.float())
            delta_ring = mixed_qkv.new_zeros((HV, self.args.ring_len, V))
            key_ring = mixed_qkv.new_zeros((H, self.args.ring_len, K))
            state = torch.zeros(HV, V, K)
            outputs = []
            for t in range(steps):
                decayed = state * gate_ring[:, t].float().exp().unsqueeze(1)
                delta = beta[t].unsqueeze(-1) * (v[t] - torch.einsum("hvk,hk->hv", decayed, k_hv[t]))
                state = decayed + delta.unsqueeze(-1) * k_hv[t].unsqueeze(1)
                outputs.append(torch.einsum("hvk,hk->hv", state, q_hv[t]))
                delta_ring[:, t] = delta.to(delta_ring.dtype)
                key_ring[:, t] = k[t].to(key_ring.dtype)
            hidden = hidden + attn.output(torch.stack(outputs).unsqueeze(1), hidden)
            hidden = hidden + layer.mlp(layer.mlp_norm(hidden)).to(hidden.dtype)
            rings.append(PromptRings(delta_ring, key_ring, gate_ring, steps))
        logits = model.lm_head(model.norm(hidden[-1:]).to(model.lm_head.weight.dtype))
        return rings, logits

    def fork_beams(self, prompt_rings: list[PromptRings], num_beams: int = 2) -> list[BeamRings]:
        beams = []
        for rings in prompt_rings:
            beam = BeamRings.allocate(rings, num_beams, dtype=rings.delta_ring.dtype)
            beam.load_prompt(rings)
            beams.append(beam)
        return beams

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """Beam 0 decodes greedily, the others sample."""
        probs = torch.softmax(logits.float() / self.args.temperature, dim=-1)
        sampled = torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)
        sampled[0] = logits[0].float().argmax()
        return sampled

    def _decode_layers(
        self, model: KDAForCausalLM, tokens: torch.Tensor, rings: list[Any], slots: torch.Tensor,
        fresh: Callable[[KDAAttention, torch.Tensor], Any] | None = None,
    ) -> torch.Tensor:
        """One decode step of ``tokens`` on per-layer ``rings`` (appended by ``fresh`` if short)."""
        hidden = model.embed_tokens(tokens)
        for idx, layer in enumerate(model.layers):
            attn = layer.attn
            mixed_qkv, a, b = attn.project(layer.attn_norm(hidden))
            if fresh is not None and idx == len(rings):
                rings.append(fresh(attn, mixed_qkv))
            ring = rings[idx]
            out = mixed_qkv.new_empty((tokens.shape[0], 1, attn.num_v_heads, attn.v_head_dim))
            fused_recurrent_kda_replayssm_decode(
                mixed_qkv, a, b, attn.A_log, attn.dt_bias, attn.scale, initial_state=ring.state,
                d_cache=ring.delta_ring, k_cache=ring.key_ring, g_cache=ring.gate_ring, out=out,
                ssm_state_indices=slots, write_pos=ring.write_pos,
                use_qk_l2norm_in_kernel=attn.use_qk_l2norm, lower_bound=attn.lower_bound,
            )
            advance_write_pos(ring.write_pos, slots, ring.gate_ring.shape[2])
            hidden = hidden + attn.output(out, hidden)
            hidden = hidden + layer.mlp(layer.mlp_norm(hidden)).to(hidden.dtype)
        return model.lm_head(model.norm(hidden).to(model.lm_head.weight.dtype)).float()

    @torch.no_grad()
    def decode_beams(self, model: KDAForCausalLM, beams: list[BeamRings], logits: torch.Tensor) -> list[list[int]]:
        num_beams = beams[0].write_pos.shape[0]
        slots = torch.arange(num_beams, dtype=torch.int32)
        logits = logits.float().expand(num_beams, -1)
        generated: list[list[int]] = [[] for _ in range(num_beams)]
        for _ in range(self.args.max_new_tokens):
            tokens = self._pick(logits)
            for row, token in enumerate(tokens.tolist()):
                generated[row].append(token)
            logits = self._decode_layers(model, tokens, beams, slots)
        return generated

    def generate_pairs(self, prompts: Sequence[Sequence[int]]) -> list[tuple[list[int], list[int], list[int]]]:
        """``(prompt, first, second)`` for every prompt."""
        if self.args.fork_prompt_rings:
            pairs = []
            for prompt in prompts:
                self.prompt_rings, logits = self.prefill_prompt(self.policy, prompt)
                self.beams = self.fork_beams(self.prompt_rings, num_beams=2)
                first, second = self.decode_beams(self.policy, self.beams, logits)
                pairs.append((list(prompt), first, second))
            return pairs
        assert self.engine is not None
        with unwrap_model_for_generation(self.model, self.accelerator) as unwrapped:
            self.engine.load_weights(unwrapped.named_parameters())
        params = SamplingParams(max_tokens=self.args.max_new_tokens, temperature=self.args.temperature, n=2)
        outputs = self.engine.generate([list(p) for p in prompts], params)
        return [(list(prompts[i]), outputs[2 * i].token_ids, outputs[2 * i + 1].token_ids) for i in range(len(prompts))]

    # -- log-probs and loss -------------------------------------------------------------

    def _fresh_ref_rings(self, attn: KDAAttention, mixed_qkv: torch.Tensor) -> RefRings:
        H, HV, K, V = attn.geometry()
        L = self.args.ring_len
        return RefRings(
            state=mixed_qkv.new_zeros((1, HV, V, K), dtype=torch.float32),
            delta_ring=mixed_qkv.new_zeros((1, HV, L, V)),
            key_ring=mixed_qkv.new_zeros((1, H, L, K)),
            gate_ring=mixed_qkv.new_zeros((1, HV, L, K)),  # expect-bug: like
            write_pos=torch.zeros(1, dtype=torch.int32),
        )

    @torch.no_grad()
    def _ref_logps_by_decode(self, prompt: Sequence[int], completion: Sequence[int]) -> torch.Tensor:
        tokens = list(prompt) + list(completion)
        slots = torch.zeros(1, dtype=torch.int32)
        rings: list[RefRings] = []
        total = torch.zeros(())
        for t, token in enumerate(tokens[:-1]):
            logits = self._decode_layers(self.ref_model, torch.tensor([token]), rings, slots, fresh=self._fresh_ref_rings)
            if t >= len(prompt) - 1:
                total = total + selective_log_softmax(logits, torch.tensor([tokens[t + 1]])).sum()
        self.last_ref_rings = rings
        return total

    def _sequence_logps(self, model: Any, prompt: Sequence[int], completion: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor([list(prompt) + list(completion)])
        logps = selective_log_softmax(model(ids)[0, :-1], ids[0, 1:])
        return logps[len(prompt) - 1 :].sum()

    def dpo_loss(self, chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor) -> torch.Tensor:
        logits = (chosen - ref_chosen) - (rejected - ref_rejected)
        if self.args.loss_type == "ipo":
            return ((logits - 1 / (2 * self.args.beta)) ** 2).mean()
        return -F.logsigmoid(self.args.beta * logits).mean()

    def training_step(self, prompts: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        chosen, rejected, ref_chosen, ref_rejected = [], [], [], []
        for prompt, first, second in self.generate_pairs(prompts):
            winner, loser = (first, second) if self.judge(prompt, first, second) == 0 else (second, first)
            chosen.append(self._sequence_logps(self.model, prompt, winner))
            rejected.append(self._sequence_logps(self.model, prompt, loser))
            if self.args.ref_logps_from_decode:
                ref_chosen.append(self._ref_logps_by_decode(prompt, winner))
                ref_rejected.append(self._ref_logps_by_decode(prompt, loser))
            else:
                with torch.no_grad():
                    ref_chosen.append(self._sequence_logps(self.ref_model, prompt, winner))
                    ref_rejected.append(self._sequence_logps(self.ref_model, prompt, loser))
        loss = self.dpo_loss(torch.stack(chosen), torch.stack(rejected), torch.stack(ref_chosen), torch.stack(ref_rejected))
        loss.backward()
        with torch.no_grad():
            for param in self.model.parameters():
                if param.grad is not None:
                    param.add_(param.grad.to(param.dtype), alpha=-self.args.learning_rate)
                    param.grad = None
        margin = (torch.stack(chosen) - torch.stack(rejected)).detach()
        return {"loss": loss.detach(), "margin": margin}


PROMPTS = [[3, 1, 4], [2, 7]]


def build_online_dpo() -> dict[str, Any]:
    """One online DPO step of a bf16 policy sampling pairs from the colocated engine."""
    trainer = OnlineDPOTrainer(TINY_MODEL_ID, args=OnlineDPOConfig(model_init_kwargs={"torch_dtype": "bfloat16"}))
    metrics = trainer.training_step(PROMPTS)
    prompt_rings, _ = trainer.prefill_prompt(trainer.policy, PROMPTS[0])
    assert trainer.engine is not None
    return {"engine_pool": trainer.engine.pool, "prompt_rings": prompt_rings, **metrics}


def build_online_dpo_bounded_beams() -> dict[str, Any]:
    """A bounded-gate bf16 policy generating from forked prompt rings, scored by ref decode."""
    args = OnlineDPOConfig(
        use_vllm=False,
        fork_prompt_rings=True,
        ref_logps_from_decode=True,
        model_init_kwargs={"torch_dtype": "bfloat16"},
    )
    trainer = OnlineDPOTrainer(f"{TINY_MODEL_ID}-bounded", args=args)
    metrics = trainer.training_step(PROMPTS)
    return {
        "prompt_rings": trainer.prompt_rings,
        "beams": trainer.beams,
        "ref_rings": trainer.last_ref_rings,
        **metrics,
    }
