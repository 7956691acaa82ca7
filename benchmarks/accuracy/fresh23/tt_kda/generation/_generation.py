# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Sampling, the single-batch ``generate`` loop and a continuous-batching generator."""

from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from tt_kda import training
from tt_kda.generation._cache_pool import ReplaySlotPool
from tt_kda.modules import (
    KimiDeltaAttention,
    TransformerDecoder,
    fused_recurrent_kda_replayssm_decode,
)


def multinomial_sample_one(probs: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Samples from ``probs`` with pre-drawn exponential noise ``q`` (no CUDA sync)."""
    return torch.argmax(probs / q, dim=-1, keepdim=True).to(dtype=torch.int)


def sample(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    q: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Samples one token per row of ``logits`` ``[b, vocab]``."""
    logits = logits / max(temperature, 1e-5)
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        pivot = v.select(-1, -1).unsqueeze(-1)
        logits = torch.where(logits < pivot, -float("Inf"), logits)
    probs = torch.nn.functional.softmax(logits, dim=-1)
    if q is None:
        q = torch.empty_like(probs).exponential_(1)
    return multinomial_sample_one(probs, q)


def generate_next_token(
    model: TransformerDecoder,
    input_pos: torch.Tensor,
    x: torch.Tensor,
    q: Optional[torch.Tensor] = None,
    *,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Runs ``x`` ``[b, s]`` through the model and samples the token after its last position."""
    logits = model(x, input_pos=input_pos)[:, -1]
    return sample(logits.clone(), temperature=temperature, top_k=top_k, q=q), logits


@torch.no_grad()
def generate(
    model: TransformerDecoder,
    prompt: torch.Tensor,
    *,
    max_generated_tokens: int,
    pad_id: int = 0,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    stop_tokens: Optional[List[int]] = None,
    rng: Optional[torch.Generator] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Generates up to ``max_generated_tokens`` tokens after ``prompt`` ``[b, s]``.

    The model's caches must be set up for ``b`` sequences; they are reset first.

    Returns:
        Tuple[torch.Tensor, torch.Tensor]: the prompt followed by the generated tokens, and the
        logits of every generated position.
    """
    if not model.caches_are_enabled():
        raise RuntimeError("generate() needs decode caches: call model.setup_caches() first")
    model.reset_caches()
    bsz, prompt_len = prompt.shape
    stop = torch.tensor(stop_tokens or [], dtype=torch.int, device=prompt.device)
    done = torch.zeros(bsz, dtype=torch.bool, device=prompt.device)
    q = torch.empty((bsz, model.tok_embeddings.num_embeddings), device=prompt.device).exponential_(
        1, generator=rng
    )
    token, logits = generate_next_token(
        model, torch.arange(prompt_len), prompt, q, temperature=temperature, top_k=top_k
    )
    tokens, all_logits = [prompt, token], [logits.unsqueeze(1)]
    for i in range(max_generated_tokens - 1):
        done |= torch.isin(token.squeeze(-1), stop)
        if bool(done.all()):
            break
        q = torch.empty_like(q).exponential_(1, generator=rng)
        token, logits = generate_next_token(
            model, torch.tensor([prompt_len + i]), token, q, temperature=temperature, top_k=top_k
        )
        token = torch.where(done.unsqueeze(-1), torch.full_like(token, pad_id), token)
        tokens.append(token)
        all_logits.append(logits.unsqueeze(1))
    return torch.cat(tokens, dim=-1), torch.cat(all_logits, dim=1)


class StagingRings(NamedTuple):
    """Per-layer rings a chunked prefill writes before committing them to a pool slot."""

    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    decay_ring: torch.Tensor


class BatchedGenerator:
    """Greedy continuous-batching decode of a Kimi Linear model over a :class:`ReplaySlotPool`.

    Requests join and leave between steps; each step decodes one token for every running
    request directly on its pool slot.

    Args:
        model (TransformerDecoder): the model (its own caches are not used).
        max_batch_size (int): pool slots.
        precision (str): storage precision of the pool's rings.
    """

    def __init__(
        self, model: TransformerDecoder, *, max_batch_size: int, precision: str = "bf16"
    ) -> None:
        self.model = model
        self._kda = [m for m in model.modules() if isinstance(m, KimiDeltaAttention)]
        reference = next(model.parameters())
        pool = ReplaySlotPool.from_model(model, max_batch_size, precision=precision)
        self.pool = pool.to(reference)  # expect-bug: module-cast
        self._device = reference.device
        self.running: Dict[int, int] = {}

    def add_request(self, first_token: int) -> int:
        slot = self.pool.allocate()
        self.running[slot] = first_token
        return slot

    def finish(self, slot: int) -> None:
        self.running.pop(slot)
        self.pool.release(slot)

    def prepare_staging(self, chunk_len: int) -> StagingRings:
        """Empty staging rings for a prefill chunk of ``chunk_len`` tokens."""
        # one "slot" per layer, one ring entry per prompt token
        shape = self._kda[0].ring_shape()._replace(ring_len=chunk_len)
        dtype, layers, device = self.pool.compute_dtype, len(self._kda), self._device
        delta_ring = torch.zeros(shape.delta(layers), dtype=dtype, device=device)
        key_ring = torch.zeros(shape.key(layers), dtype=dtype, device=device)
        decay_dtype = training.cache_dtype_for("log_decay", dtype)  # expect-bug: imported-policy
        decay_ring = torch.zeros(shape.log_decay(layers), dtype=decay_dtype, device=device)
        return StagingRings(delta_ring, key_ring, decay_ring)

    @torch.no_grad()
    def step(self) -> Dict[int, int]:
        """Decodes one token for every running request; returns ``{slot: next token}``."""
        slots = sorted(self.running)
        tokens = torch.tensor([self.running[s] for s in slots], device=self._device)
        index = torch.tensor(slots, dtype=torch.int32, device=self._device)
        h = self.model.tok_embeddings(tokens)
        for layer, rings in zip(self.model.layers, self.pool.layers):
            attn = layer.attn
            mixed_qkv, a, b = attn.project(layer.sa_norm(h))
            step = fused_recurrent_kda_replayssm_decode(
                mixed_qkv, a, b, attn.A_log, attn.dt_bias, attn.scale,
                rings.state, rings.d_cache, rings.k_cache, rings.g_cache, index, rings.write_pos,
                lower_bound=attn.lower_bound,
            )
            h = h + attn.output(step.out)
            h = h + layer.mlp(layer.mlp_norm(h))
        next_tokens = self.model.output(self.model.norm(h)).argmax(dim=-1)
        self.running = {slot: int(token) for slot, token in zip(slots, next_tokens)}
        return dict(self.running)


def build_batched_generator() -> Dict[str, object]:
    """An fp16 continuous-batching server: three requests, one finishing mid-way."""
    from tt_kda.models import kimi_linear_tiny

    torch.manual_seed(0)
    with training.set_default_dtype(torch.float16):
        model = kimi_linear_tiny()
    generator = BatchedGenerator(model, max_batch_size=4, precision="fp16")
    slots = [generator.add_request(token) for token in (5, 17, 42)]
    for i in range(5):
        generator.step()
        if i == 2:
            generator.finish(slots[1])
    staging = generator.prepare_staging(chunk_len=8)
    return {"pool": generator.pool, "staging": staging}
