from typing import List, Optional, Tuple

import torch

from .cache import BufferCache
from .transformer import Transformer


@torch.inference_mode()
def generate(
    encoded_prompts: List[List[int]],
    model: Transformer,
    *,
    max_tokens: int,
    temperature: float,
    chunk_size: Optional[int] = None,
    eos_id: Optional[int] = None,
    cache: Optional[BufferCache] = None,
) -> Tuple[List[List[int]], List[List[float]]]:
    model = model.eval()
    B, V = len(encoded_prompts), model.args.vocab_size
    seqlens = [len(x) for x in encoded_prompts]
    # Cache: a caller (a server) may pass one it reuses across calls
    cache_window = max(seqlens) + max_tokens
    if cache is None:
        cache = BufferCache(model.args, B, cache_window)
        cache.to(device=model.device, dtype=model.dtype)
    else:
        assert cache.max_seq_len >= cache_window, (cache.max_seq_len, cache_window)
        cache.grow(B)
    cache.reset()
    if model.ring_cache is not None:
        model.ring_cache.reset()
    # Bookkeeping
    logprobs: List[List[float]] = [[] for _ in range(B)]
    last_token_prelogits = None
    # One chunk if size not specified
    max_prompt_len = max(seqlens)
    if chunk_size is None:
        chunk_size = max_prompt_len
    # Encode prompt by chunks
    for s in range(0, max_prompt_len, chunk_size):
        prompt_chunks = [p[s : s + chunk_size] for p in encoded_prompts]
        assert all(len(p) > 0 for p in prompt_chunks)
        prelogits = model.forward(
            torch.tensor(sum(prompt_chunks, []), device=model.device, dtype=torch.long),
            seqlens=[len(p) for p in prompt_chunks],
            cache=cache,
        )
        logits = torch.log_softmax(prelogits, dim=-1)
        offset = 0
        for i_seq, sequence in enumerate(prompt_chunks):
            logprobs[i_seq].extend([logits[offset + i, sequence[i + 1]].item() for i in range(len(sequence) - 1)])
            offset += len(sequence)
        last_token_prelogits = prelogits.index_select(0, torch.tensor([len(p) for p in prompt_chunks], device=prelogits.device).cumsum(dim=0) - 1)
    # decode
    generated_tensors = []
    is_finished = torch.tensor([False for _ in range(B)])
    for _ in range(max_tokens):
        next_token = sample(last_token_prelogits, temperature=temperature, top_p=0.8)
        if eos_id is not None:
            is_finished = is_finished | (next_token == eos_id).cpu()
        if is_finished.all():
            break
        last_token_logits = torch.log_softmax(last_token_prelogits, dim=-1)
        for i in range(B):
            logprobs[i].append(last_token_logits[i, next_token[i]].item())
        generated_tensors.append(next_token[:, None])
        last_token_prelogits = model.forward(next_token, seqlens=[1] * B, cache=cache)
        assert last_token_prelogits.shape == (B, V)
    generated_tokens = torch.cat(generated_tensors, 1).tolist() if generated_tensors else []
    return generated_tokens, logprobs


def sample(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    if temperature > 0:
        probs = torch.softmax(logits / temperature, dim=-1)
        next_token = sample_top_p(probs, top_p)
    else:
        next_token = torch.argmax(logits, dim=-1).unsqueeze(0)
    return next_token.reshape(-1)


def sample_top_p(probs: torch.Tensor, p: float) -> torch.Tensor:
    assert 0 <= p <= 1
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    mask = probs_sum - probs_sort > p
    probs_sort[mask] = 0.0
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    next_token = torch.multinomial(probs_sort, num_samples=1)
    return torch.gather(probs_idx, -1, next_token)


def _prompts(n: int = 2) -> List[List[int]]:
    return [[1 + 3 * i, 2 + 3 * i, 3 + 3 * i] for i in range(n)]


def build_generate(tmp_dir):
    from .testing import write_checkpoint_folder

    model = Transformer.from_folder(write_checkpoint_folder(tmp_dir), max_batch_size=2, device="cpu", dtype=torch.bfloat16)
    cache = BufferCache(model.args, 2, 16).to(device=model.device, dtype=model.dtype)
    tokens, logprobs = generate(_prompts(), model, max_tokens=3, temperature=0.7, cache=cache)
    return {"cache": cache, "tokens": torch.tensor(tokens)}


def _chat_session(tmp_dir, graph: bool):
    from .testing import write_checkpoint_folder

    model = Transformer.from_folder(write_checkpoint_folder(tmp_dir), max_batch_size=2, device="cpu", dtype=torch.bfloat16)
    model.attach_rings(max_batch_size=2, graph=graph)
    cache = BufferCache(model.args, 2, 16).to(device=model.device, dtype=model.dtype)
    generate(_prompts(), model, max_tokens=2, temperature=0.0, cache=cache)
    return {"model": model, "cache": cache}


def build_chat_session(tmp_dir):
    return _chat_session(tmp_dir, graph=False)


def build_graph_chat_session(tmp_dir):
    return _chat_session(tmp_dir, graph=True)


def build_server_cache():
    from .testing import random_transformer

    model = random_transformer(torch.bfloat16)
    cache = BufferCache(model.args, 1, 16).to(device=model.device, dtype=model.dtype)
    generate(_prompts(1), model, max_tokens=1, temperature=0.0, cache=cache)
    generate(_prompts(3), model, max_tokens=2, temperature=0.0, cache=cache)
    return cache
