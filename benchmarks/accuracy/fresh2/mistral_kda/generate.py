import contextlib
from typing import Iterator, List, Optional, Tuple

import torch

from . import replayssm
from .cache import BufferCache
from .transformer import AnyCache, Transformer, write_tiny_folder


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def make_cache(model: Transformer, batch_size: int, in_place: bool = False) -> BufferCache:
    """The cache of a generation. ``in_place`` allocates it on the model's device in its dtype
    right away: no float32 copy on the host first, which matters for long contexts."""
    kda = model.args.kda
    ring_dtype, _ = kda.cache_dtypes(model.dtype)
    shape = (model.n_local_layers, batch_size, kda.num_heads, kda.num_v_heads, kda.head_k_dim, kda.head_v_dim,
             kda.replay_len)
    if in_place:
        with torch.device(model.device), _default_dtype(ring_dtype):  # expect-bug: default-dtype id=in-place
            cache = BufferCache(*shape)
    else:
        cache = BufferCache(*shape).to(device=model.device, dtype=ring_dtype)
    cache.reset()
    return cache


def fork_cache(model: Transformer, cache: BufferCache, n: int) -> BufferCache:
    """Every sequence of ``cache`` ``n`` times over, for ``n`` samples of each prompt after one prefill."""
    forked = BufferCache.__new__(BufferCache)
    forked.__dict__.update(cache.__dict__)
    for name in ("cache_delta", "cache_key", "cache_gate"):
        src = getattr(cache, name)
        # the samples decode in the model's dtype (the cache may be a parked or pinned-dtype one)
        dst = torch.empty((src.shape[0], src.shape[1] * n, *src.shape[2:]), device=model.device, dtype=model.dtype)  # expect-bug: pool-dtype
        setattr(forked, name, dst.copy_(src.repeat_interleave(n, dim=1)))
    forked.cache_state = cache.cache_state.repeat_interleave(n, dim=1)
    forked.write_pos = cache.write_pos.repeat_interleave(n, dim=1)
    forked.seqlens = [s for s in cache.seqlens for _ in range(n)]
    forked.max_batch_size = cache.max_batch_size * n
    return forked


def sample_top_p(probs: torch.Tensor, p: float) -> torch.Tensor:
    assert 0 <= p <= 1
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs > p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    choice = torch.multinomial(sorted_probs / sorted_probs.sum(dim=-1, keepdim=True), num_samples=1)
    return torch.gather(order, -1, choice)


def sample(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    if temperature > 0:
        return sample_top_p(torch.softmax(logits / temperature, dim=-1), top_p).reshape(-1)
    return torch.argmax(logits, dim=-1).reshape(-1)


@torch.inference_mode()
def generate(encoded_prompts: List[List[int]], model: Transformer, *, max_tokens: int, temperature: float,
             top_p: float = 0.8, chunk_size: Optional[int] = None, eos_id: Optional[int] = None,
             cache: Optional[AnyCache] = None) -> Tuple[List[List[int]], List[List[float]]]:
    model = model.eval()
    B = len(encoded_prompts)
    seqlens = [len(x) for x in encoded_prompts]
    if cache is None:
        cache = make_cache(model, B)
    cache.reset()
    if model.prefix_state is not None:
        for layer_id, rings in model.prefix_state.items():
            for name, t in rings.items():
                getattr(cache, name)[layer_id, :B].copy_(t)
    # prefill, chunk by chunk
    max_prompt_len = max(seqlens)
    chunk_size = chunk_size or max_prompt_len
    last_token_logits = None
    for s in range(0, max_prompt_len, chunk_size):
        chunks = [p[s:s + chunk_size] for p in encoded_prompts]
        assert all(len(p) > 0 for p in chunks)
        prelogits = model.forward(torch.tensor(sum(chunks, []), device=model.device, dtype=torch.long),
                                  seqlens=[len(p) for p in chunks], cache=cache)
        last_token_logits = prelogits.index_select(0, torch.tensor([len(p) for p in chunks], device=model.device).cumsum(0) - 1)
    assert last_token_logits is not None
    # decode
    generated_tokens, logprobs = [], [[] for _ in range(B)]
    is_finished = torch.zeros(B, dtype=torch.bool, device=model.device)
    for _ in range(max_tokens):
        next_token = sample(last_token_logits, temperature=temperature, top_p=top_p)
        token_logprobs = torch.log_softmax(last_token_logits, dim=-1).gather(1, next_token[:, None])[:, 0]
        for i, lp in enumerate(token_logprobs.tolist()):
            logprobs[i].append(lp)
        if eos_id is not None:
            is_finished |= next_token == eos_id
        if is_finished.all():
            break
        generated_tokens.append(next_token[:, None])
        last_token_logits = model.forward(next_token, seqlens=[1] * B, cache=cache)
    generated = torch.cat(generated_tokens, 1).tolist() if generated_tokens else [[] for _ in range(B)]
    return generated, logprobs


# ---- builders -------------------------------------------------------------------------------

PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]


def _generate(tmp_dir, dtype=torch.bfloat16, in_place=False, **kda):
    folder = write_tiny_folder(tmp_dir, dtype=dtype, **kda)
    model = Transformer.from_folder(folder, max_batch_size=4, device="cpu", dtype=dtype)
    cache = make_cache(model, len(PROMPTS), in_place=in_place)
    generate(PROMPTS, model, max_tokens=2, temperature=0.0, cache=cache)
    return model, cache


def build_generate(tmp_dir):
    return {"cache": _generate(tmp_dir)[1], "kernel": dict(replayssm.LAST_CALL)}


def build_generate_in_place(tmp_dir):
    return {"cache": _generate(tmp_dir, in_place=True)[1], "kernel": dict(replayssm.LAST_CALL)}


def build_generate_pinned_cache_dtype(tmp_dir):
    cache = _generate(tmp_dir, dtype=torch.float32, cache_dtype="bfloat16")[1]
    return {"cache": cache, "kernel": dict(replayssm.LAST_CALL)}


def build_fork_samples(tmp_dir):
    model, cache = _generate(tmp_dir)
    forked = fork_cache(model, cache, 2)
    with torch.inference_mode():
        model.forward(torch.tensor([3, 3, 4, 4]), seqlens=[1] * 4, cache=forked)
    return {"cache": forked, "kernel": dict(replayssm.LAST_CALL)}


def _short_prompts(tmp_dir, dtype):
    model = Transformer.from_folder(write_tiny_folder(tmp_dir, dtype=dtype), max_batch_size=2, device="cpu", dtype=dtype)
    cache = make_cache(model, 2)
    with torch.inference_mode():
        model.forward(torch.tensor([1, 2, 3, 4, 5, 6]), seqlens=[3, 3], cache=cache)
    return {"cache": cache, "kernel": dict(replayssm.LAST_CALL)}


def build_short_prompts(tmp_dir):
    return _short_prompts(tmp_dir, torch.bfloat16)


def build_short_prompts_fp32(tmp_dir):
    return _short_prompts(tmp_dir, torch.float32)
