"""Model construction, mixed precision and float8 conversion (single-device stand-ins for FSDP2)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config_manager import TORCH_DTYPE_MAP, JobConfig
from .models import kda_configs
from .models.model import KDAAttention, Transformer


@contextlib.contextmanager
def set_default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None


def mp_policy_from_config(job_config: JobConfig) -> MixedPrecisionPolicy:
    training = job_config.training
    return MixedPrecisionPolicy(TORCH_DTYPE_MAP[training.mixed_precision_param], TORCH_DTYPE_MAP[training.mixed_precision_reduce])


def decode_state_dtype(job_config: JobConfig) -> torch.dtype:
    """dtype of the decode caches that the generation script builds: they follow the params."""
    return mp_policy_from_config(job_config).param_dtype  # expect-bug: imported-policy id=titan-decode-dtype


def materialize_model(job_config: JobConfig) -> Transformer:
    """Materialises the model on meta, then allocates and initialises it on CPU."""
    args = kda_configs[job_config.model.flavor]
    with torch.device("meta"), set_default_dtype(TORCH_DTYPE_MAP[job_config.model.init_dtype]):  # expect-bug: default-dtype id=titan-meta-default
        model = Transformer(args)
    model.to_empty(device="cpu")
    model.init_weights(buffer_device=torch.device("cpu"))
    return model


def apply_mixed_precision(model: nn.Module, policy: MixedPrecisionPolicy) -> nn.Module:
    """What the unsharded forward sees under FSDP2: the module in ``param_dtype``."""
    model.to(policy.param_dtype)  # expect-bug: module-cast
    return model


def apply_mixed_precision_params(model: nn.Module, policy: MixedPrecisionPolicy) -> nn.Module:
    """Casts parameters only, as ``fully_shard(mp_policy=...)`` does; buffers keep their dtypes."""
    for param in model.parameters():
        param.data = param.data.to(policy.param_dtype)
    return model


def uniform_buffers(model: nn.Module, policy: MixedPrecisionPolicy) -> None:
    """Flat-buffer sharding wants one dtype per module: bring the rings to ``param_dtype``."""
    for module in model.modules():
        if isinstance(module, KDAAttention):
            module.d_buf, module.k_buf = module.d_buf.to(policy.param_dtype), module.k_buf.to(policy.param_dtype)
            module.decay_buf = module.decay_buf.to(policy.param_dtype)  # expect-bug: cast


class Float8Linear(nn.Linear):
    """Linear with an e4m3 weight and a per-tensor scale (dequantised for the matmul on CPU)."""

    @classmethod
    def from_float(cls, linear: nn.Linear) -> Float8Linear:
        new = cls(linear.in_features, linear.out_features, bias=False, device="meta")
        scale = linear.weight.detach().abs().amax().clamp(min=1e-12) / 448.0
        new.register_buffer("weight_scale", scale.float())
        new.weight = nn.Parameter((linear.weight.detach() / scale).to(torch.float8_e4m3fn), requires_grad=False)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype) * self.weight_scale.to(x.dtype))


class Float8Converter:
    def __init__(self, job_config: JobConfig) -> None:
        self.enabled = "float8" in job_config.model.converters
        self.filter_fqns = job_config.float8.filter_fqns

    def convert(self, model: nn.Module) -> nn.Module:
        for fqn, module in list(model.named_modules()):
            if self.enabled and isinstance(module, nn.Linear) and not any(f in fqn for f in self.filter_fqns):
                model.set_submodule(fqn, Float8Linear.from_float(module))
        return model


def build_params_only_mp() -> Transformer:
    job_config = JobConfig.from_dict({"model": {"converters": ["float8"]}})
    model = materialize_model(job_config)
    apply_mixed_precision_params(model, mp_policy_from_config(job_config))
    Float8Converter(job_config).convert(model)
    model(torch.tensor([3, 1]))
    return model


def build_bf16_init() -> Transformer:
    return materialize_model(JobConfig.from_dict({"model": {"init_dtype": "bfloat16"}}))
