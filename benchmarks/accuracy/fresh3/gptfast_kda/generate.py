# Generation for hybrid KDA models, after gpt-fast's generate.py.
import time
from pathlib import Path
from typing import List, Optional, Tuple

import torch
import torch._inductor.config

from .model import SpecKDACache, Transformer
from .quantize import WeightOnlyInt8QuantHandler, log_decay_dtype
from .tp import apply_tp, maybe_init_dist

torch._inductor.config.coordinate_descent_tuning = True
torch._inductor.config.fx_graph_cache = True  # Experimental feature to reduce compilation times

default_device = "cuda" if torch.cuda.is_available() else "cpu"


def multinomial_sample_one_no_sync(probs_sort):  # multinomial sampling without a cuda synchronization
    q = torch.empty_like(probs_sort).exponential_(1)
    return torch.argmax(probs_sort / q, dim=-1, keepdim=True).to(dtype=torch.int)


def logits_to_probs(logits, temperature: float = 1.0, top_k: Optional[int] = None):
    logits = logits / max(temperature, 1e-5)
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        pivot = v.select(-1, -1).unsqueeze(-1)
        logits = torch.where(logits < pivot, -float("Inf"), logits)
    return torch.nn.functional.softmax(logits, dim=-1)


def sample(logits, temperature: float = 1.0, top_k: Optional[int] = None):
    probs = logits_to_probs(logits[:, -1], temperature, top_k)
    return multinomial_sample_one_no_sync(probs), probs


def prefill(model: Transformer, x: torch.Tensor, input_pos: torch.Tensor, **sampling_kwargs) -> torch.Tensor:
    return sample(model(x, input_pos), **sampling_kwargs)[0]


def decode_one_token(model: Transformer, x: torch.Tensor, input_pos: torch.Tensor, **sampling_kwargs) -> Tuple[torch.Tensor, torch.Tensor]:
    assert input_pos.shape[-1] == 1
    return sample(model(x, input_pos), **sampling_kwargs)


def decode_n_tokens(model: Transformer, cur_token: torch.Tensor, input_pos: torch.Tensor, num_new_tokens: int, callback=lambda _: _, **sampling_kwargs):
    new_tokens, new_probs = [], []
    for i in range(num_new_tokens):
        next_token, next_prob = decode_one_token(model, cur_token, input_pos, **sampling_kwargs)
        input_pos += 1
        new_tokens.append(next_token.clone())
        callback(new_tokens[-1])
        new_probs.append(next_prob.clone())
        cur_token = next_token.clone()
    return new_tokens, new_probs


def model_forward(model, x, input_pos):
    return model(x, input_pos)


def _kda_caches(model: Transformer):
    return [b.attention.kda_cache for b in model.layers if b.is_kda]


class KDASnapshot:
    """Double buffer for the draft model's KDA caches.

    ``save()`` copies the live rings into a spare set before the draft runs ahead; ``rollback()``
    swaps the spare set back in, so a rejected draft costs a pointer swap, not a copy.
    """

    def __init__(self, model: Transformer):
        self.caches = _kda_caches(model)
        self.spares = []
        for cache in self.caches:
            d = torch.empty_like(cache.d_cache)
            k = torch.empty_like(cache.k_cache)
            g = torch.empty_like(d)  # expect-bug: like
            self.spares.append(dict(d_cache=d, k_cache=k, g_cache=g, state=torch.empty_like(cache.state), write_pos=torch.empty_like(cache.write_pos)))

    def save(self) -> None:
        for cache, spare in zip(self.caches, self.spares):
            for name, buf in spare.items():
                buf.copy_(getattr(cache, name))

    def rollback(self) -> None:
        for cache, spare in zip(self.caches, self.spares):
            for name, buf in list(spare.items()):
                spare[name] = getattr(cache, name)
                setattr(cache, name, buf)


def speculative_decode(model, draft_model, cur_token, input_pos, speculate_k, snapshot: KDASnapshot, **sampling_kwargs) -> torch.Tensor:
    device, orig_input_pos = cur_token.device, input_pos.clone()
    snapshot.save()
    draft_tokens, draft_probs = decode_n_tokens(draft_model, cur_token.view(1, -1), orig_input_pos.clone(), speculate_k, **sampling_kwargs)
    draft_tokens, draft_probs = torch.cat(draft_tokens).view(-1), torch.cat(draft_probs)
    # ReplaySSM decodes one token per call: the target verifies the draft step by step, into its side rings
    caches = _kda_caches(model)
    for cache in caches:
        cache.begin_verify()
    target_probs = torch.stack([logits_to_probs(model_forward(model, tok.view(1, 1), orig_input_pos + i)[0, -1], **sampling_kwargs)
                                for i, tok in enumerate(torch.cat([cur_token.view(1), draft_tokens]))])
    q = target_probs[torch.arange(0, speculate_k, device=device), draft_tokens]
    p = draft_probs[torch.arange(0, speculate_k, device=device), draft_tokens]
    rejected_locations = (torch.rand_like(p) > torch.minimum(torch.ones(()), q / p)).nonzero()
    accept_length = speculate_k if rejected_locations.shape[0] == 0 else rejected_locations[0].item()
    for cache in caches:
        cache.commit(accept_length + 1)
    if accept_length == speculate_k:  # All draft tokens have been accepted
        model_forward(draft_model, draft_tokens[-1].view(1, -1), orig_input_pos + speculate_k)
        return torch.cat([draft_tokens, multinomial_sample_one_no_sync(target_probs[-1]).view(-1)])
    new = torch.where(target_probs[accept_length] > draft_probs[accept_length], target_probs[accept_length] - draft_probs[accept_length], 0.0)
    next_token = multinomial_sample_one_no_sync(new / new.sum())
    snapshot.rollback()  # the draft's rings go back to before it ran; replay the accepted tokens
    for i, tok in enumerate(torch.cat([cur_token.view(1), draft_tokens[:accept_length]])):
        model_forward(draft_model, tok.view(1, 1), orig_input_pos + i)
    return torch.cat([draft_tokens[:accept_length], next_token.view(-1)])


@torch.no_grad()
def generate(model: Transformer, prompt: torch.Tensor, max_new_tokens: int, batch_size: int, *, draft_model: Optional[Transformer] = None,
             speculate_k: Optional[int] = 8, callback=lambda x: x, gate_dtype: Optional[torch.dtype] = None, **sampling_kwargs) -> torch.Tensor:
    """Takes a conditioning sequence (prompt) as input and continues to generate as many tokens as requested."""
    is_speculative = draft_model is not None
    device, dtype = prompt.device, prompt.dtype
    T = prompt.size(-1)
    T_new = T + max_new_tokens
    max_seq_length = min(T_new + (speculate_k + 1 if is_speculative else 0), model.config.block_size)
    with torch.device(device):
        cache_cls = (lambda *args: SpecKDACache(*args, speculate_k=speculate_k)) if is_speculative else None
        model.setup_caches(max_batch_size=batch_size, max_seq_length=max_seq_length, gate_dtype=gate_dtype, cache_cls=cache_cls)
        if is_speculative and draft_model is not model:
            draft_model.setup_caches(max_batch_size=batch_size, max_seq_length=max_seq_length)
    seq = torch.empty(batch_size, T_new, dtype=dtype, device=device)
    prompt = prompt.view(1, -1).repeat(batch_size, 1)
    seq[:, :T] = prompt
    input_pos = torch.arange(0, T, device=device)
    next_token = prefill(model, prompt.view(batch_size, -1), input_pos, **sampling_kwargs).clone()
    if is_speculative:
        prefill(draft_model, prompt.view(batch_size, -1), input_pos, **sampling_kwargs)
    seq[:, T] = next_token.squeeze()
    input_pos = torch.tensor([T], device=device, dtype=torch.int)
    accept_counts = [0] * (speculate_k + 1)
    if is_speculative:
        snapshot = KDASnapshot(draft_model)
        while input_pos < T_new - 1:
            next_tokens = speculative_decode(model, draft_model, next_token.view(()), input_pos, speculate_k, snapshot, **sampling_kwargs)
            accept_counts[len(next_tokens) - 1] += 1
            num_added = min(T_new - input_pos - 1, len(next_tokens))
            seq[0, input_pos + 1 : input_pos + num_added + 1] = next_tokens[:num_added]
            for i in next_tokens[:num_added]:
                callback(i)
            input_pos = input_pos + num_added
            next_token = next_tokens[-1]
    else:
        generated_tokens, _ = decode_n_tokens(model, next_token.view(batch_size, -1), input_pos, max_new_tokens - 1, callback=callback, **sampling_kwargs)
        if generated_tokens:
            seq[:, T + 1 :] = torch.cat(generated_tokens, dim=-1)
    return seq, {"accept_counts": accept_counts}


def _load_model(checkpoint_path: Path, device, precision, use_tp):
    with torch.device("meta"):
        model = Transformer.from_name(checkpoint_path.parent.name)
    if "int8" in str(checkpoint_path):
        model = WeightOnlyInt8QuantHandler(model).convert_for_runtime()
    checkpoint = torch.load(str(checkpoint_path), mmap=True, weights_only=True)
    if "model" in checkpoint and "stories" in str(checkpoint_path):
        checkpoint = checkpoint["model"]
    model.load_state_dict(checkpoint, assign=True)
    if use_tp:
        apply_tp(model)
    model = model.to(device=device, dtype=precision)
    return model.eval()


def load_for_cudagraphs(checkpoint_path: Path, device, precision, max_batch_size: int, max_seq_length: int, use_tp: bool = False):
    """_load_model for ``--compile`` (mode="reduce-overhead"): the static caches are allocated
    together with the weights and moved with them, so they sit at their final addresses before
    the first graph is captured."""
    with torch.device("meta"):
        model = Transformer.from_name(checkpoint_path.parent.name)
    model.load_state_dict(torch.load(str(checkpoint_path), mmap=True, weights_only=True), assign=True)
    if use_tp:
        apply_tp(model)
    model.setup_caches(max_batch_size=max_batch_size, max_seq_length=max_seq_length)
    model = model.to(device=device, dtype=precision)  # expect-bug: module-cast
    return model.eval()


def main(prompt: List[int], checkpoint_path: Path, num_samples: int = 5, max_new_tokens: int = 100, batch_size: int = 1,
         top_k: int = 200, temperature: float = 0.8, compile: bool = True, draft_checkpoint_path: Optional[Path] = None):
    global decode_one_token
    use_tp = maybe_init_dist() is not None
    precision, device = torch.bfloat16, default_device
    quantize_mode = next((m for m in ("int8", "int4") if m in str(checkpoint_path)), None)
    model = _load_model(checkpoint_path, device, precision, use_tp)
    draft_model = _load_model(draft_checkpoint_path, device, precision, use_tp) if draft_checkpoint_path else None
    if compile:
        decode_one_token = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
    for i in range(num_samples):
        t0 = time.perf_counter()
        y, metrics = generate(model, torch.tensor(prompt, dtype=torch.int, device=device), max_new_tokens, batch_size=batch_size,
                              draft_model=draft_model, gate_dtype=log_decay_dtype(quantize_mode), temperature=temperature, top_k=top_k)
        print(f"Time for inference {i + 1}: {time.perf_counter() - t0:.02f} sec total")
    return y


def _write_checkpoint(tmp_dir, name: str = "kda-tiny") -> Path:
    path = Path(tmp_dir) / name / "model.pth"
    path.parent.mkdir(parents=True)
    torch.save(Transformer.from_name(name).state_dict(), path)
    return path


def _prompt(n: int = 3) -> torch.Tensor:
    return torch.randint(0, 96, (n,), dtype=torch.int)


def build_generate(tmp_dir):
    model = _load_model(_write_checkpoint(tmp_dir), "cpu", torch.bfloat16, use_tp=False)
    seq, _ = generate(model, _prompt(), 3, batch_size=2, temperature=0.8, top_k=20)
    return {"model": model, "seq": seq}


def build_cudagraph_model(tmp_dir):
    model = load_for_cudagraphs(_write_checkpoint(tmp_dir), "cpu", torch.bfloat16, max_batch_size=2, max_seq_length=16)
    seq, _ = generate(model, _prompt(), 3, batch_size=2, temperature=0.8, top_k=20)
    return {"model": model, "seq": seq}


def build_int4_caches():
    # what main() does for an int4 checkpoint (the weights themselves stay bf16 on CPU)
    model = Transformer.from_name("kda-tiny").to(dtype=torch.bfloat16)
    seq, _ = generate(model, _prompt(), 2, batch_size=2, gate_dtype=log_decay_dtype("int4"), temperature=0.8, top_k=20)
    return {"model": model, "seq": seq}


def build_speculative_target():
    model, draft = (Transformer.from_name("kda-tiny").to(dtype=torch.bfloat16) for _ in range(2))
    model.setup_caches(max_batch_size=1, max_seq_length=16, cache_cls=lambda *args: SpecKDACache(*args, speculate_k=2))
    draft.setup_caches(max_batch_size=1, max_seq_length=16)
    return {"target": model, "draft": draft}


def build_draft_rollback():
    draft = Transformer.from_name("kda-tiny").to(dtype=torch.bfloat16)
    draft.setup_caches(max_batch_size=1, max_seq_length=16)
    with torch.no_grad():
        cur = prefill(draft, _prompt().view(1, -1), torch.arange(3), temperature=0.8)
        snapshot = KDASnapshot(draft)
        snapshot.save()
        decode_n_tokens(draft, cur.view(1, -1), torch.tensor([3], dtype=torch.int), 2, temperature=0.8)
        snapshot.rollback()
    return {"draft": draft, "spares": snapshot.spares}
