# Copyright Lightning AI. Licensed under the Apache License 2.0, see LICENSE file.

"""Full definition of a Kimi Delta Attention decoder, all of it in this single file.

Based on the nanoGPT implementation: https://github.com/karpathy/nanoGPT and litgpt's ``model.py``.
Decoding uses ReplaySSM: see :mod:`litgpt_kda.kv_cache`.
"""

import math
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from typing_extensions import Self

from litgpt_kda.config import Config
from litgpt_kda.kv_cache import ReplayCache
from litgpt_kda.ops import kda_replay_decode, l2norm
from litgpt_kda.utils import RingDtypes, precision_to_dtype


class GPT(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        assert config.padded_vocab_size is not None
        self.config = config

        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=config.bias)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                h=nn.ModuleList(Block(config, block_idx) for block_idx in range(config.n_layer)),
                ln_f=RMSNorm(config.n_embd, eps=config.norm_eps),
            )
        )
        self._ring_len = config.ring_len

    @property
    def ring_len(self) -> int:
        return self._ring_len

    @ring_len.setter
    def ring_len(self, value: int) -> None:
        """When doing inference, the rings of existing caches are resized to ``value`` rows."""
        if value < 2:
            raise ValueError(f"ring_len must be at least 2, got {value}")
        self._ring_len = value
        for block in self.transformer.h:
            if block.attn.kv_cache is not None:
                block.attn.kv_cache.resize(value)

    def _init_weights(self, module: nn.Module) -> None:
        """Meant to be used with `gpt.apply(gpt._init_weights)`."""
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        idx: torch.Tensor,
        slots: Optional[torch.Tensor] = None,
        force_flush: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Logits of ``idx`` (``[B, T]``). ``T > 1`` prefills the caches, ``T == 1`` decodes one step."""
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x, slots=slots, force_flush=force_flush)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)

    @classmethod
    def from_name(cls, name: str, **kwargs: Any) -> Self:
        return cls(Config.from_name(name, **kwargs))

    def set_kv_cache(
        self,
        batch_size: int,
        ring_len: Optional[int] = None,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        dtypes: Optional[RingDtypes] = None,
    ) -> None:
        """Creates a replay cache with ``batch_size`` slots in every layer.

        ``dtype`` (default: the config's ``cache_precision``, else the dtype of the weights) is
        used for the states and the delta/key rings; ``dtypes`` sets every ring explicitly.
        """
        if ring_len is not None:
            self._ring_len = ring_len
        if dtypes is None:
            if dtype is None:
                dtype = self.config.cache_dtype or self.lm_head.weight.dtype
            logdecay_dtype = precision_to_dtype(self.config.logdecay_precision)  # expect-bug: imported-policy id=compact-logdecay
            dtypes = RingDtypes(delta=dtype, key=dtype, logdecay=logdecay_dtype)
        for block in self.transformer.h:
            block.attn.kv_cache = block.attn.build_kv_cache(batch_size, self._ring_len, device, dtypes)

    def clear_kv_cache(self) -> None:
        for block in self.transformer.h:
            block.attn.kv_cache = None

    def export_kv_cache(self, dtype: Optional[torch.dtype] = None) -> Dict[str, torch.Tensor]:
        """Every layer's replay cache as one flat dict, to hand a prefilled prompt to another worker.

        ``dtype`` narrows the floating point buffers for the transfer.
        """
        tensors = {}
        for i, block in enumerate(self.transformer.h):
            for name, buffer in block.attn.kv_cache.named_buffers():
                if dtype is not None and buffer.is_floating_point():
                    buffer = buffer.to(dtype)  # expect-bug: cast
                tensors[f"transformer.h.{i}.attn.kv_cache.{name}"] = buffer
        return tensors

    def import_kv_cache(self, tensors: Dict[str, torch.Tensor]) -> None:
        """Loads caches written by :meth:`export_kv_cache` into the existing caches."""
        for i, block in enumerate(self.transformer.h):
            prefix = f"transformer.h.{i}.attn.kv_cache."
            block.attn.kv_cache.load_state_dict(
                {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            )

    def kv_cache_dtypes(self, dtype: torch.dtype) -> Dict[str, torch.dtype]:
        """dtype of every replay-cache buffer for a model running in ``dtype``."""
        return {**dict.fromkeys(ReplayCache.float_buffers, dtype), "write_pos": torch.int32}  # expect-bug: container id=cache-dtypes

    def convert_kv_cache(self, dtype: torch.dtype) -> None:
        """Re-types existing caches, e.g. after the weights were converted to ``dtype``."""
        dtypes = self.kv_cache_dtypes(dtype)
        for block in self.transformer.h:
            cache = block.attn.kv_cache
            for name, buffer_dtype in dtypes.items():
                setattr(cache, name, getattr(cache, name).to(buffer_dtype))  # expect-bug: container id=cache-dtypes


class Block(nn.Module):
    def __init__(self, config: Config, block_idx: int) -> None:
        super().__init__()
        self.norm_1 = RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = KDAttention(config, block_idx)
        self.norm_2 = RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = config.mlp_class(config)
        self.config = config

    def forward(
        self,
        x: torch.Tensor,
        slots: Optional[torch.Tensor] = None,
        force_flush: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x), slots=slots, force_flush=force_flush)
        return x + self.mlp(self.norm_2(x))


class KDAttention(nn.Module):
    """Kimi Delta Attention: a gated delta rule with a per-channel decay."""

    def __init__(self, config: Config, block_idx: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(config.n_embd, config.qkv_size, bias=config.bias)
        self.a_proj = nn.Linear(config.n_embd, config.n_value_head * config.head_size, bias=False)
        self.b_proj = nn.Linear(config.n_embd, config.n_value_head, bias=False)
        self.A_log = nn.Parameter(torch.empty(config.n_value_head))
        self.dt_bias = nn.Parameter(torch.empty(config.n_value_head, config.head_size))
        self.proj = nn.Linear(config.value_size, config.n_embd, bias=config.bias)
        # disabled by default
        self.kv_cache: Optional[ReplayCache] = None
        self.block_idx = block_idx
        self.config = config
        self.scale = 1.0 / math.sqrt(config.head_size)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1.0, 16.0).log())
            self.dt_bias.copy_(torch.empty_like(self.dt_bias).uniform_(-2.0, 0.0))

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The kernel inputs of one token per row: ``mixed_qkv``, ``a`` (``[B, HV, K]``) and ``b``."""
        B = x.shape[0]
        a = self.a_proj(x).view(B, self.config.n_value_head, self.config.head_size)
        return self.qkv(x), a, self.b_proj(x)

    def forward(
        self,
        x: torch.Tensor,
        slots: Optional[torch.Tensor] = None,
        force_flush: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        if self.kv_cache is None:
            raise TypeError("You need to call `model.set_kv_cache()`")
        B, T, _ = x.size()
        if T > 1:
            return self.prefill(x)
        if slots is None:
            slots = torch.arange(B, dtype=torch.int32, device=x.device)
        cache = self.kv_cache
        mixed_qkv, a, b = self.project(x[:, 0])
        out = x.new_zeros(B, 1, self.config.n_value_head, self.config.value_head_size)
        kda_replay_decode(
            mixed_qkv, a, b, self.A_log, self.dt_bias, self.scale,
            initial_state=cache.state,
            d_cache=cache.delta_cache,
            k_cache=cache.key_cache,
            g_cache=cache.logdecay_cache,
            out=out,
            ssm_state_indices=slots,
            write_pos=cache.write_pos[slots.long()],
            force_flush=force_flush,
            use_qk_l2norm_in_kernel=self.config.use_qk_l2norm,
            lower_bound=self.config.gate_lower_bound,
        )
        cache.advance(slots, force_flush)
        return self.proj(out.view(B, 1, -1))

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """Runs a whole prompt through the recurrence and leaves the caches ready for decoding.

        The state after the last full ring becomes the checkpoint; the prompt's remaining tokens
        are written to the rings, exactly as token-by-token decoding would have left them.
        """
        cache = self.kv_cache
        B, T, _ = x.size()
        if B != cache.n_slots:
            raise ValueError(f"prefill fills every slot: expected {cache.n_slots} rows, got {B}")
        H, HV = self.config.n_head, self.config.n_value_head
        K, V = self.config.head_size, self.config.value_head_size
        L = cache.ring_len
        group = HV // H

        qkv = self.qkv(x).float()
        q = qkv[..., : H * K].view(B, T, H, K)
        k = qkv[..., H * K : 2 * H * K].view(B, T, H, K)
        v = qkv[..., 2 * H * K :].view(B, T, HV, V)
        if self.config.use_qk_l2norm:
            q, k = l2norm(q), l2norm(k)
        gate_x = self.a_proj(x).view(B, T, HV, K) + self.dt_bias
        A = self.A_log.exp()[:, None]
        lb = self.config.gate_lower_bound
        g = -A * F.softplus(gate_x) if lb is None else lb * torch.sigmoid(A * gate_x)  # expect-bug: promotion id=prefill-gate
        beta = torch.sigmoid(self.b_proj(x).float())

        n_tail = T % L
        n_ckpt = T - n_tail
        kh = k.repeat_interleave(group, dim=2)
        qh = self.scale * q.repeat_interleave(group, dim=2)
        S = cache.state.float()
        checkpoint = S
        ys, deltas = [], []
        for t in range(T):
            if t == n_ckpt:
                checkpoint = S
            S = S * g[:, t].float().exp()[..., None, :]
            delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhvk,bhk->bhv", S, kh[:, t]))
            S = S + delta[..., None] * kh[:, t, :, None, :]
            ys.append(torch.einsum("bhvk,bhk->bhv", S, qh[:, t]))
            deltas.append(delta)
        if n_tail == 0:
            checkpoint = S

        pad = (0, 0, 0, L - n_tail)
        cache.state.copy_(checkpoint)
        cache.delta_cache = F.pad(torch.stack(deltas, 2)[:, :, n_ckpt:], pad).to(cache.delta_cache.dtype)
        cache.key_cache = F.pad(k[:, n_ckpt:].transpose(1, 2), pad).to(cache.key_cache.dtype)
        cache.logdecay_cache = F.pad(g[:, n_ckpt:].transpose(1, 2), pad)  # expect-bug: promotion id=prefill-gate
        cache.write_pos.fill_(n_tail)
        y = torch.stack(ys, 1).to(x.dtype)
        return self.proj(y.reshape(B, T, -1))

    def build_kv_cache(
        self,
        batch_size: int,
        ring_len: int,
        device: Optional[torch.device] = None,
        dtypes: Optional[RingDtypes] = None,
    ) -> ReplayCache:
        if dtypes is None:
            dtype = self.qkv.weight.dtype
            dtypes = RingDtypes(dtype, dtype)
        assert dtypes.delta == dtypes.key, "the fused kernel reads the state and both rings in one dtype"
        return ReplayCache(
            batch_size,
            self.config.n_head,
            self.config.n_value_head,
            self.config.head_size,
            self.config.value_head_size,
            ring_len,
            device=device,
            dtype=dtypes.delta,
            logdecay_dtype=dtypes.logdecay,
        )


class LLaMAMLP(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.fc_1 = nn.Linear(config.n_embd, config.intermediate_size, bias=config.bias)
        self.fc_2 = nn.Linear(config.n_embd, config.intermediate_size, bias=config.bias)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_fc_1 = self.fc_1(x)
        x_fc_2 = self.fc_2(x)
        x = torch.nn.functional.silu(x_fc_1) * x_fc_2
        return self.proj(x)


class RMSNorm(torch.nn.Module):
    """Root Mean Square Layer Normalization.

    Derived from https://github.com/bzhangGo/rmsnorm/blob/master/rmsnorm_torch.py. BSD 3-Clause License:
    https://github.com/bzhangGo/rmsnorm/blob/master/LICENSE.
    """

    def __init__(self, size: int, dim: int = -1, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = eps
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        # NOTE: the original RMSNorm paper implementation is not equivalent
        norm_x = torch.mean(x * x, dim=self.dim, keepdim=True)
        x_normed = x * torch.rsqrt(norm_x + self.eps)
        return (x_normed * self.weight.float()).to(dtype=dtype)

    def reset_parameters(self) -> None:
        torch.nn.init.ones_(self.weight)


def build_gpt_decode():
    """A bf16 model with fp32 log-decay rings decoding a few tokens, ring flushes included."""
    torch.manual_seed(0)
    config = Config.from_name("kimi-kda-tiny-gqa")
    model = GPT(config)
    model.apply(model._init_weights)
    model = model.to(torch.bfloat16)
    model.set_kv_cache(batch_size=2)
    idx = torch.randint(0, config.padded_vocab_size, (2, 1))
    logits = []
    for step in range(6):
        force_flush = torch.tensor([0, int(step == 1)], dtype=torch.int32)
        logits.append(model(idx, force_flush=force_flush))
        idx = logits[-1].argmax(-1)
    return {"model": model, "logits": torch.cat(logits, 1)}


def build_prefilled_gpt():
    """bf16 models prefilled with a prompt, one of them with the compact serving config."""
    torch.manual_seed(0)
    config = Config.from_name("kimi-kda-tiny")
    model = GPT(config).to(torch.bfloat16)
    model.set_kv_cache(batch_size=1)
    prompt = torch.randint(0, config.padded_vocab_size, (1, 6))
    logits = model(prompt)
    next_logits = model(logits[:, -1:].argmax(-1))

    compact = GPT(Config.from_name("kimi-kda-tiny-compact"))
    compact.set_kv_cache(batch_size=2)
    compact_logits = compact(torch.randint(0, config.padded_vocab_size, (2, 1)))
    return {"model": model, "logits": next_logits, "compact": compact, "compact_logits": compact_logits}


def build_cache_handoff():
    """A prefilled bf16 model's caches exported for a decode worker, and a model re-typed to fp16."""
    torch.manual_seed(0)
    config = Config.from_name("kimi-kda-tiny")
    prefill_model = GPT(config).to(torch.bfloat16)
    prefill_model.set_kv_cache(batch_size=1)
    prefill_model(torch.randint(0, config.padded_vocab_size, (1, 3)))
    exported = prefill_model.export_kv_cache(dtype=torch.bfloat16)

    decode_model = GPT(config).to(torch.bfloat16)
    decode_model.load_state_dict(prefill_model.state_dict(), strict=False)
    decode_model.set_kv_cache(batch_size=1)
    decode_model.import_kv_cache(exported)

    half_model = GPT(config)
    half_model.set_kv_cache(batch_size=1)
    half_weights = {k: v.half() for k, v in prefill_model.state_dict().items() if ".kv_cache." not in k}
    half_model.load_state_dict(half_weights, strict=False, assign=True)
    half_model.convert_kv_cache(torch.float16)
    return {"exported": exported, "decode_model": decode_model, "half_model": half_model}
