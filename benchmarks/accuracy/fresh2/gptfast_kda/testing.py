"""Fixtures of the tests and benchmarks: tiny random models and checkpoints, a reference dump, and
random inputs of the decode kernel."""
import contextlib
from pathlib import Path
from typing import Dict, Iterator

import torch
from torch import Tensor
from torch.nn import functional as F

from . import kernels
from .model import ModelArgs, Transformer


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def tiny_model(name: str = "kda-tiny", precision: torch.dtype = torch.bfloat16, batch_size: int = 2,
               max_seq_length: int = 16) -> Transformer:
    """A randomly initialised model with its caches, for tests that need no checkpoint."""
    model = Transformer.from_name(name)
    model.setup_caches(max_batch_size=batch_size, max_seq_length=max_seq_length)
    return model.to(dtype=precision).eval()  # expect-bug: module-cast


def write_checkpoint(tmp_dir, name: str = "kda-tiny", dtype: torch.dtype = torch.bfloat16) -> Path:
    """A random checkpoint laid out like ``checkpoints/<name>/model.pth``."""
    model = Transformer.from_name(name).to(dtype=dtype)
    path = Path(tmp_dir) / name / "model.pth"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return path


def write_reference_state(tmp_dir, name: str = "kda-tiny") -> Path:
    """A stand-in for the dump of the HF reference after a prompt: the recurrent state in float32,
    the rest in the checkpoint's ``torch_dtype`` (bfloat16), as its cache keeps them."""
    config = ModelArgs.from_name(name)
    H, HV, K, V, L = config.kda_heads, config.kda_v_heads, config.kda_head_dim, config.kda_v_dim, config.replay_len
    shapes = dict(d_ring=(HV, L, V), k_ring=(H, L, K), g_ring=(HV, L, K))
    dump = {}
    for i in range(config.n_layer):
        prefix = f"model.layers.{i}.self_attn."
        dump[prefix + "state"] = torch.randn(HV, V, K, dtype=torch.float32)
        dump.update({prefix + key: torch.randn(shape, dtype=torch.bfloat16) for key, shape in shapes.items()})
    path = Path(tmp_dir) / "reference_state.bin"
    torch.save(dump, path)
    return path


def random_decode_inputs(config: ModelArgs, batch_size: int, precision: torch.dtype = torch.bfloat16) -> Dict[str, Tensor]:
    """Random inputs of one decode step (kernel tests): activations and rings in ``precision``, the
    state and the parameters of the gate in float32."""
    H, HV, K, V, L = config.kda_heads, config.kda_v_heads, config.kda_head_dim, config.kda_v_dim, config.replay_len
    with default_dtype(precision):  # expect-bug: default-dtype id=fixture-default
        mixed_qkv = torch.randn(batch_size, 2 * H * K + HV * V)
        a, b = torch.randn(batch_size, HV * K), torch.randn(batch_size, HV)
        d_cache = torch.randn(batch_size, HV, L, V)
        k_cache = F.normalize(torch.randn(batch_size, H, L, K), dim=-1)
        g_cache = F.logsigmoid(torch.randn(batch_size, HV, L, K))  # expect-bug: default-dtype id=fixture-default
        initial_state = torch.randn(batch_size, HV, V, K, dtype=torch.float32)
        out = torch.zeros(batch_size, HV, V)
    return dict(
        mixed_qkv=mixed_qkv, a=a, b=b,
        A_log=torch.log(torch.linspace(1, 16, HV, dtype=torch.float32)),
        dt_bias=torch.zeros(HV * K, dtype=torch.float32),
        initial_state=initial_state, d_cache=d_cache, k_cache=k_cache, g_cache=g_cache, out=out,
        ssm_state_indices=torch.arange(batch_size, dtype=torch.int32),
        write_pos=torch.randint(0, L, (batch_size,), dtype=torch.int32),
    )


def build_tiny_model():
    return tiny_model("kda-tiny", torch.bfloat16)


def build_tiny_model_fp32():
    return tiny_model("kda-tiny", torch.float32)


def build_decode_inputs():
    inputs = random_decode_inputs(ModelArgs.from_name("kda-tiny"), batch_size=2)
    kernels.replay_kda_decode(scale=0.125, use_qk_l2norm_in_kernel=True, **inputs)
    return {"inputs": inputs, "kernel": dict(kernels.LAST_CALL)}
