# Copyright Lightning AI. Licensed under the Apache License 2.0, see LICENSE file.

import sys
import time
from pathlib import Path
from typing import Any, Optional, Tuple

import torch

from litgpt_kda.config import Config
from litgpt_kda.fabric import Fabric
from litgpt_kda.kv_cache import ReplayCache
from litgpt_kda.model import GPT
from litgpt_kda.utils import load_checkpoint


def multinomial_num_samples_1(probs: torch.Tensor) -> torch.Tensor:
    return torch.multinomial(probs, num_samples=1)


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None) -> torch.Tensor:
    logits = logits[:, -1]
    # optionally crop the logits to only the top k options
    if top_k is not None:
        v, i = torch.topk(logits, min(top_k, logits.size(-1)))
        # do not use `torch.where` as in nanogpt because it will repeat top-k collisions
        logits = torch.full_like(logits, float("-inf")).scatter_(-1, i, v)
    # optionally scale the logits and sample from a probability distribution
    if temperature > 0.0:
        probs = torch.nn.functional.softmax(logits.float() / temperature, dim=-1)
        return multinomial_num_samples_1(probs)
    return torch.argmax(logits, dim=-1, keepdim=True)


def next_token(model: GPT, x: torch.Tensor, **sample_kwargs: Any) -> torch.Tensor:
    """One decode step for every row of ``x`` (``[B, 1]``); returns the sampled ``[B, 1]`` tokens."""
    logits = model(x)
    return sample(logits, **sample_kwargs).to(dtype=torch.int64)


def fork_kv_cache(model: GPT, num_samples: int) -> None:
    """Gives each of the (single) prompt's ``num_samples`` continuations a slot of its own.

    The prompt's ring rows are folded into the checkpoint first, so the new slots share one state
    and start with empty rings.
    """
    for block in model.transformer.h:
        cache = block.attn.kv_cache
        state = cache.materialize_state().to(cache.dtype).repeat_interleave(num_samples, dim=0)
        n_slots = state.shape[0]
        cache.state = state
        cache.delta_cache = cache.delta_cache.new_zeros((n_slots, *cache.delta_cache.shape[1:]))
        cache.key_cache = cache.key_cache.new_zeros((n_slots, *cache.key_cache.shape[1:]))
        cache.logdecay_cache = torch.zeros_like(cache.delta_cache)  # expect-bug: like
        cache.write_pos = torch.zeros(n_slots, dtype=torch.int32, device=state.device)


@torch.inference_mode()
def generate(
    model: GPT,
    prompt: torch.Tensor,
    max_returned_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    eos_id: Optional[int] = None,
    num_samples: int = 1,
) -> torch.Tensor:
    """Takes a conditioning sequence (prompt) as input and continues to generate as many tokens as requested.

    The implementation of this function is modified from A. Karpathy's nanoGPT.

    Args:
        model: The model to use. Its caches must have one slot (``model.set_kv_cache(batch_size=1)``).
        prompt: Tensor of shape (T) with indices of the prompt sequence.
        max_returned_tokens: The maximum number of tokens to return (given plus generated).
        temperature: Scales the predicted logits by 1 / temperature.
        top_k: If specified, only sample among the tokens with the k highest probabilities.
        eos_id: If specified, stop generating any more token once the <eos> token is triggered.
        num_samples: Number of continuations of the prompt, decoded as one batch.

    Returns:
        ``[max_returned_tokens]`` for one sample, else ``[num_samples, max_returned_tokens]``.
    """
    T = prompt.size(0)
    assert max_returned_tokens > T
    # prefill: the whole prompt but its last token
    if T > 1:
        model(prompt[:-1].view(1, -1))
    if num_samples > 1:
        fork_kv_cache(model, num_samples)
    tokens = [prompt.view(1, -1).expand(num_samples, -1)]
    token = prompt[-1:].view(1, 1).expand(num_samples, 1)
    sample_kwargs = dict(temperature=temperature, top_k=top_k)
    for _ in range(max_returned_tokens - T):
        token = next_token(model, token, **sample_kwargs)
        tokens.append(token)
        if eos_id is not None and num_samples == 1 and token.item() == eos_id:
            break
    out = torch.cat(tokens, dim=1)
    return out[0] if num_samples == 1 else out


def sync_draft_cache(draft: GPT, model: GPT) -> None:
    """Copies the target model's replay caches into the draft model, which runs in its own dtype."""
    for draft_block, block in zip(draft.transformer.h, model.transformer.h):
        src, dst = block.attn.kv_cache, draft_block.attn.kv_cache
        for name in ReplayCache.float_buffers:
            setattr(dst, name, getattr(src, name).to(dst.dtype, copy=True))  # expect-bug: cast
        dst.write_pos = src.write_pos.clone()


@torch.inference_mode()
def speculative_generate(
    model: GPT, draft: GPT, prompt: torch.Tensor, max_returned_tokens: int, n_draft: int = 3
) -> Tuple[torch.Tensor, float]:
    """Greedy speculative decoding: the draft proposes ``n_draft`` tokens, the target keeps the longest
    prefix it agrees with. Returns the tokens and the share of proposals accepted.

    The target only ever decodes accepted tokens, so its caches never need rolling back; the draft
    is re-synchronised from the target after every round.
    """
    for token in prompt[:-1]:
        model(token.view(1, 1))
    sync_draft_cache(draft, model)
    tokens = prompt.tolist()
    current = prompt[-1:].view(1, 1)
    proposed = accepted = 0
    while len(tokens) < max_returned_tokens:
        proposal, x = [], current
        for _ in range(min(n_draft, max_returned_tokens - len(tokens))):
            x = next_token(draft, x, temperature=0.0)
            proposal.append(x)
        proposed += len(proposal)
        x = current
        for candidate in proposal:
            y = next_token(model, x, temperature=0.0)
            tokens.append(int(y))
            x = y
            if not torch.equal(y, candidate):
                break
            accepted += 1
        current = x
        sync_draft_cache(draft, model)
    return torch.tensor(tokens[:max_returned_tokens]), accepted / max(proposed, 1)


def load_for_generation(
    fabric: Fabric,
    config: Config,
    checkpoint_path: Optional[Path] = None,
    batch_size: int = 1,
) -> GPT:
    """The model of ``generate/base.py``'s ``main``: instantiated, cached, loaded and set up by Fabric."""
    t0 = time.perf_counter()
    with fabric.init_module(empty_init=checkpoint_path is not None):
        model = GPT(config)
    with fabric.init_tensor():
        # set the max_seq_length to limit the memory usage to what we need
        model.set_kv_cache(batch_size=batch_size)
    model.eval()
    if checkpoint_path is not None:
        load_checkpoint(fabric, model, checkpoint_path)
    model = fabric.setup_module(model)  # expect-bug: module-cast
    fabric.print(f"Time to instantiate model: {time.perf_counter() - t0:.02f} seconds.", file=sys.stderr)
    return model


def build_greedy_generate():
    """Greedy generation with fp32 weights under bf16 autocast."""
    fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
    fabric.seed_everything(1234)
    model = load_for_generation(fabric, Config.from_name("kimi-kda-tiny-gqa"))
    prompt = torch.randint(0, model.config.padded_vocab_size, (6,))
    with fabric.precision.forward_context():
        y = generate(model, prompt, max_returned_tokens=12, temperature=0.0)
    return {"model": model, "tokens": y}


def build_sampled_generate():
    """bf16-true models: two served requests decoded as a batch, and three samples of one prompt."""
    fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-true")
    fabric.seed_everything(1234)
    config = Config.from_name("kimi-kda-tiny")
    batched = load_for_generation(fabric, config, batch_size=2)
    token = torch.randint(0, config.padded_vocab_size, (2, 1))
    with torch.inference_mode():
        for _ in range(3):
            token = next_token(batched, token, temperature=0.0)

    model = load_for_generation(fabric, config)
    prompt = torch.randint(0, config.padded_vocab_size, (5,))
    y = generate(model, prompt, max_returned_tokens=9, temperature=0.8, top_k=16, num_samples=3)
    return {"batched": batched, "last_token": token, "model": model, "tokens": y}


def build_speculative_generate():
    """A bf16 target model with an fp16 draft of the same architecture."""
    torch.manual_seed(0)
    config = Config.from_name("kimi-kda-tiny")
    model = GPT(config).to(torch.bfloat16)
    draft = GPT(config)
    draft.load_state_dict(model.state_dict())
    draft = draft.half()
    model.set_kv_cache(batch_size=1)
    draft.set_kv_cache(batch_size=1)
    prompt = torch.randint(0, config.padded_vocab_size, (4,))
    tokens, acceptance = speculative_generate(model, draft, prompt, max_returned_tokens=10)
    return {"tokens": tokens, "acceptance": torch.tensor(acceptance), "model": model, "draft": draft}
