"""Generation: prefill, a torch.compile'd one-token decode, int8 checkpoints and tensor parallelism.

``--reference_state`` continues from the ReplaySSM state that the HF reference implementation
reached on the same prompt (``reference_state.bin``): after the prefill the KDA layers take the
reference's state, so that a divergence of the two continuations points at the decode kernel.
"""
import logging
import time
from pathlib import Path
from typing import Dict, Optional

import torch
from torch import Tensor

from . import kernels
from .model import Transformer
from .quantize import WeightOnlyInt8QuantHandler

logger = logging.getLogger(__name__)


def device_sync(device: str) -> None:
    if "cuda" in device:
        torch.cuda.synchronize(device)


def _sample_no_sync(probs: Tensor) -> Tensor:
    # argmax(p / E) with E ~ Exp(1) is a sample of p, without a host sync
    noise = torch.empty_like(probs).exponential_(1)
    return (probs / noise).argmax(dim=-1, keepdim=True).to(dtype=torch.int)


def logits_to_probs(logits: Tensor, temperature: float = 1.0, top_k: Optional[int] = None) -> Tensor:
    logits = logits / max(temperature, 1e-5)
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = torch.where(logits < v[..., -1:], -float("Inf"), logits)
    return torch.nn.functional.softmax(logits, dim=-1)


def sample(logits: Tensor, temperature: float = 1.0, top_k: Optional[int] = None):
    probs = logits_to_probs(logits[:, -1], temperature, top_k)
    return _sample_no_sync(probs), probs


def prefill(model: Transformer, x: Tensor, input_pos: Tensor, **sampling_kwargs) -> Tensor:
    # input_pos: [S], x: [B, S]
    return sample(model(x, input_pos), **sampling_kwargs)[0]


def decode_one_token(model: Transformer, x: Tensor, input_pos: Tensor, **sampling_kwargs):
    # input_pos: [1], x: [B, 1]
    assert input_pos.shape[-1] == 1
    return sample(model(x, input_pos), **sampling_kwargs)


def decode_n_tokens(model: Transformer, cur_token: Tensor, input_pos: Tensor, num_new_tokens: int, **sampling_kwargs):
    new_tokens = []
    for _ in range(num_new_tokens):
        next_token, _ = decode_one_token(model, cur_token, input_pos, **sampling_kwargs)
        input_pos += 1
        new_tokens.append(next_token.clone())
        cur_token = next_token.clone()
    return new_tokens


def load_reference_state(path: Path) -> Dict[str, Tensor]:
    """``reference_state.bin``: per KDA layer ``model.layers.{i}.self_attn.{state,d_ring,k_ring,g_ring}``."""
    return torch.load(str(path), mmap=True, weights_only=True)


def install_reference_state(model: Transformer, reference: Dict[str, Tensor]) -> None:
    """Replaces the state of every slot by the reference's."""
    for i, cache in enumerate(model.replay_caches()):
        prefix = f"model.layers.{i}.self_attn."
        B = cache.state.size(0)
        cache.state.copy_(reference[prefix + "state"].expand_as(cache.state))
        cache.d_cache = reference[prefix + "d_ring"].expand(B, -1, -1, -1).to(cache.d_cache.dtype).contiguous()
        cache.k_cache = reference[prefix + "k_ring"].expand(B, -1, -1, -1).to(cache.k_cache.dtype).contiguous()
        cache.g_cache = reference[prefix + "g_ring"].expand(B, -1, -1, -1).contiguous()  # expect-bug: load
        cache.write_pos.zero_()


@torch.no_grad()
def generate(model: Transformer, prompt: Tensor, max_new_tokens: int, batch_size: int = 1, *,
             reference: Optional[Dict[str, Tensor]] = None, **sampling_kwargs) -> Tensor:
    """Takes a conditioning sequence (prompt) as input and continues to generate as many tokens as requested."""
    device = prompt.device
    T = prompt.size(-1)
    T_new = T + max_new_tokens
    with torch.device(device):
        model.setup_caches(max_batch_size=batch_size, max_seq_length=min(T_new, model.config.block_size))
    seq = torch.zeros(batch_size, T_new, dtype=prompt.dtype, device=device)
    prompt = prompt.view(1, -1).repeat(batch_size, 1)
    seq[:, :T] = prompt
    next_token = prefill(model, prompt, torch.arange(0, T, device=device), **sampling_kwargs)
    seq[:, T] = next_token.squeeze(-1)
    if reference is not None:
        install_reference_state(model, reference)
    input_pos = torch.tensor([T], device=device, dtype=torch.int)
    generated = decode_n_tokens(model, next_token.view(batch_size, -1), input_pos, max_new_tokens - 1, **sampling_kwargs)
    if generated:
        seq[:, T + 1:] = torch.cat(generated, dim=-1)
    return seq


def _load_model(checkpoint_path: Path, device: str, precision: torch.dtype, use_tp: bool) -> Transformer:
    with torch.device("meta"):
        model = Transformer.from_name(checkpoint_path.parent.name)
    if "int8" in str(checkpoint_path):
        logger.info("Using int8 weight-only quantization!")
        model = WeightOnlyInt8QuantHandler(model).convert_for_runtime()
    checkpoint = torch.load(str(checkpoint_path), mmap=True, weights_only=True)
    model.load_state_dict(checkpoint, assign=True)
    model = model.to(device=device, dtype=precision)
    if model.config.static_state_slots:
        # CUDA graphs replay fixed addresses: the ReplaySSM pool is allocated once, for every request
        with torch.device(device):
            model.setup_caches(model.config.static_state_slots, model.config.block_size)
    if use_tp:
        from .tp import apply_tp

        logger.info("Applying tensor parallel to model ...")
        apply_tp(model)  # after the static pool: it is sharded too
    return model.eval()


def main(checkpoint_path: Path, prompt_len: int = 16, num_samples: int = 5, max_new_tokens: int = 100,
         batch_size: int = 1, compile: bool = True, device: str = "cuda", reference_state: Optional[Path] = None,
         **sampling_kwargs) -> None:
    from .tp import maybe_init_dist

    global decode_one_token
    rank = maybe_init_dist()
    t0 = time.time()
    model = _load_model(checkpoint_path, device, torch.bfloat16, use_tp=rank is not None)
    device_sync(device)
    print(f"Time to load model: {time.time() - t0:.02f} seconds")
    if compile:
        decode_one_token = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
    torch.manual_seed(1234)
    prompt = torch.randint(0, model.config.vocab_size, (prompt_len,), device=device)  # no tokenizer in this port
    reference = load_reference_state(reference_state) if reference_state is not None else None
    for i in range(num_samples):
        t0 = time.perf_counter()
        y = generate(model, prompt, max_new_tokens, batch_size=batch_size, reference=reference, **sampling_kwargs)
        device_sync(device)
        print(f"Sample {i}: {(y.size(-1) - prompt_len) * batch_size / (time.perf_counter() - t0):.02f} tokens/sec")


# ---- builders (tiny configs, CPU) -------------------------------------------------------------

def _run(tmp_dir, name: str, precision=torch.bfloat16, prompt_len: int = 6, checkpoint_path=None, reference=None):
    from .testing import write_checkpoint

    model = _load_model(checkpoint_path or write_checkpoint(tmp_dir, name), "cpu", precision, use_tp=False)
    generate(model, torch.arange(1, prompt_len + 1), max_new_tokens=3, batch_size=2, reference=reference,
             temperature=1.0, top_k=8)
    return {"caches": model.replay_caches(), "kernel": dict(kernels.LAST_CALL)}


def build_bf16(tmp_dir):
    return _run(tmp_dir, "kda-tiny")


def build_int8(tmp_dir):
    from .quantize import quantize
    from .testing import write_checkpoint

    checkpoint_path = quantize(write_checkpoint(tmp_dir, "kda-tiny"), "int8")
    return _run(tmp_dir, "kda-tiny", prompt_len=3, checkpoint_path=checkpoint_path)


def build_lower_bound_long_prompt(tmp_dir):
    return _run(tmp_dir, "kda-tiny-lb", prompt_len=6)


def build_lower_bound_short_prompt(tmp_dir):
    return _run(tmp_dir, "kda-tiny-lb", prompt_len=3)


def build_lower_bound_fp32(tmp_dir):
    return _run(tmp_dir, "kda-tiny-lb", precision=torch.float32)


def build_static_slots(tmp_dir):
    return _run(tmp_dir, "kda-tiny-static")


def build_reference_state(tmp_dir):
    from .testing import write_reference_state

    return _run(tmp_dir, "kda-tiny", reference=load_reference_state(write_reference_state(tmp_dir, "kda-tiny")))
