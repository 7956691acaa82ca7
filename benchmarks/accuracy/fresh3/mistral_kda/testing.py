"""Fixtures of the unit tests and benchmarks: tiny random models, checkpoint folders, LoRA files."""
import json
from dataclasses import asdict
from pathlib import Path

import torch

from .args import KDAArgs, TransformerArgs
from .cache import BufferCache
from .transformer import Transformer


def tiny_args(**overrides) -> TransformerArgs:
    params = dict(dim=32, n_layers=4, head_dim=8, hidden_dim=64, n_heads=4, n_kv_heads=2, norm_eps=1e-5, vocab_size=64,
                  rope_theta=10000.0, kda=KDAArgs(n_heads=2, n_v_heads=2, head_dim=8, ring_len=4, full_attn_every=2))
    params.update(overrides)
    return TransformerArgs(**params)


def random_transformer(dtype: torch.dtype = torch.bfloat16, **overrides) -> Transformer:
    return Transformer(tiny_args(**overrides)).to(dtype=dtype)


def tiny_transformer(dtype: torch.dtype = torch.bfloat16) -> Transformer:
    """Random tiny model whose parameters are created in ``dtype`` directly (the larger test
    configs would not fit in memory as an fp32 copy first)."""
    torch.set_default_dtype(dtype)  # expect-bug: default-dtype id=fixture-default
    return Transformer(tiny_args())


def tiny_cache(model: Transformer, batch_size: int = 2, max_seq_len: int = 16) -> BufferCache:
    cache = BufferCache(model.args, batch_size, max_seq_len)
    cache.to(device=model.device, dtype=model.dtype)
    cache.reset()
    return cache


def write_checkpoint_folder(folder, dtype: torch.dtype = torch.bfloat16, **overrides) -> Path:
    """A folder as published (params.json, consolidated.00.pth) for ``Transformer.from_folder``."""
    folder = Path(folder) / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    model = random_transformer(dtype, **overrides)
    (folder / "params.json").write_text(json.dumps(asdict(model.args)))
    torch.save(model.state_dict(), folder / "consolidated.00.pth")
    return folder


def write_lora(folder, model: Transformer, rank: int = 2, dtype: torch.dtype = torch.bfloat16) -> Path:
    lora = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.endswith(("wq", "wv", "in_proj")):
            lora[f"{name}.lora_A.weight"] = (torch.randn(rank, module.in_features) * 0.01).to(dtype)
            lora[f"{name}.lora_B.weight"] = (torch.randn(module.out_features, rank) * 0.01).to(dtype)
    path = Path(folder) / "lora.pth"
    torch.save(lora, path)
    return path


def _fixture_run(model: Transformer):
    from .generate import generate

    cache = tiny_cache(model)
    generate([[1, 2, 3], [4, 5, 6]], model, max_tokens=2, temperature=0.0, cache=cache)
    return {"model": model, "cache": cache}


def build_fixture_cache():
    return _fixture_run(tiny_transformer(torch.bfloat16))


def build_random_fixture_cache():
    return _fixture_run(random_transformer(torch.bfloat16))
