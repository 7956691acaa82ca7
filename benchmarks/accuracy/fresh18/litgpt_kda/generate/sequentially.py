# Copyright Lightning AI. Licensed under the Apache License 2.0, see LICENSE file.

"""Decoding with the replay caches kept in host memory, layer by layer.

At long contexts and many concurrent sequences the rings of all layers do not fit next to the
weights. The caches then live in (pinned) host memory and each layer's cache is brought to the
device for its decode step. Layers listed in ``resident_layers`` keep their caches on the device.
"""

from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import torch

from litgpt_kda.config import Config
from litgpt_kda.model import GPT, KDAttention
from litgpt_kda.ops import advance_write_pos, kda_replay_decode


class HostRings(NamedTuple):
    """One layer's replay cache in host memory."""

    state: torch.Tensor
    delta: torch.Tensor
    key: torch.Tensor
    logdecay: torch.Tensor
    write_pos: torch.Tensor


def allocate_layer_rings(
    config: Config, n_slots: int, dtype: Optional[torch.dtype] = None, device: str = "cpu"
) -> HostRings:
    """Empty host caches of one layer; ``dtype=None`` allocates in torch's default dtype."""
    H, HV = config.n_head, config.n_value_head
    K, V, L = config.head_size, config.value_head_size, config.ring_len
    pin = torch.cuda.is_available() and device == "cpu"
    state = torch.zeros(n_slots, HV, V, K, dtype=dtype, device=device, pin_memory=pin)
    delta = torch.zeros(n_slots, HV, L, V, dtype=dtype, device=device, pin_memory=pin)
    key = torch.zeros(n_slots, H, L, K, dtype=dtype, device=device, pin_memory=pin)
    logdecay = torch.zeros(n_slots, HV, L, K, device=device, pin_memory=pin)  # expect-bug: default-dtype
    write_pos = torch.zeros(n_slots, dtype=torch.int32, device=device, pin_memory=pin)
    return HostRings(state=state, delta=delta, key=key, logdecay=logdecay, write_pos=write_pos)


def materialize(config: Config, n_slots: int, dtype: torch.dtype) -> Tuple[GPT, List[HostRings]]:
    """The model and its host caches, created directly in ``dtype`` (no float32 copy on the host)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = GPT(config)
        rings = [allocate_layer_rings(config, n_slots) for _ in range(config.n_layer)]
    finally:
        torch.set_default_dtype(previous)
    return model, rings


def host_rings_from_model(model: GPT) -> List[HostRings]:
    """Moves every layer's replay cache off the model into host memory."""
    rings = []
    for block in model.transformer.h:
        cache = block.attn.kv_cache
        rings.append(
            HostRings(
                state=cache.state.cpu(),
                delta=cache.delta_cache.cpu(),
                key=cache.key_cache.cpu(),
                logdecay=cache.logdecay_cache.cpu(),
                write_pos=cache.write_pos.cpu(),
            )
        )
        block.attn.kv_cache = None
    return rings


class StagingBuffers:
    """Device buffers the offloaded layers are copied through; one set serves every layer."""

    def __init__(self, config: Config, n_slots: int, device: torch.device, dtype: torch.dtype) -> None:
        H, HV = config.n_head, config.n_value_head
        K, V, L = config.head_size, config.value_head_size, config.ring_len
        self.state = torch.zeros(n_slots, HV, V, K, device=device, dtype=dtype)
        self.delta = torch.zeros(n_slots, HV, L, V, device=device, dtype=dtype)
        self.key = torch.zeros(n_slots, H, L, K, device=device, dtype=dtype)
        self.logdecay = torch.zeros(n_slots, HV, L, K, device=device, dtype=dtype)  # expect-bug: pool-dtype id=staging

    def load(self, host: HostRings) -> None:
        for dst, src in zip((self.state, self.delta, self.key, self.logdecay), host[:4]):
            dst.copy_(src, non_blocking=True)

    def store(self, host: HostRings) -> None:
        for dst, src in zip(host[:4], (self.state, self.delta, self.key, self.logdecay)):
            dst.copy_(src, non_blocking=True)


class SequentialDecoder:
    def __init__(
        self,
        model: GPT,
        rings: List[HostRings],
        device: Optional[torch.device] = None,
        resident_layers: Iterable[int] = (),
        staging: bool = False,
    ) -> None:
        self.model = model
        self.rings = rings
        self.device = device or torch.device("cpu")
        self.resident_layers = set(resident_layers)
        self.resident: Dict[int, Dict[str, torch.Tensor]] = {}
        n_slots = rings[0].state.shape[0]
        dtype = model.lm_head.weight.dtype
        self.staging = StagingBuffers(model.config, n_slots, self.device, dtype) if staging else None

    @torch.inference_mode()
    def step(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits of one decode step; ``idx`` is ``[n_slots, 1]``."""
        transformer = self.model.transformer
        x = transformer.wte(idx.to(self.device))
        for i, block in enumerate(transformer.h):
            x = x + self._attention(i, block.attn, block.norm_1(x))
            x = x + block.mlp(block.norm_2(x))
        return self.model.lm_head(transformer.ln_f(x))

    def _attention(self, i: int, attn: KDAttention, x: torch.Tensor) -> torch.Tensor:
        config = attn.config
        B = x.shape[0]
        host = self.rings[i]
        mixed_qkv, a, b = attn.project(x[:, 0])
        out = x.new_zeros(B, 1, config.n_value_head, config.value_head_size)
        write_pos = host.write_pos.to(self.device)
        inputs = (mixed_qkv, a, b, attn.A_log, attn.dt_bias, attn.scale)
        options = dict(
            out=out,
            ssm_state_indices=torch.arange(B, dtype=torch.int32, device=self.device),
            write_pos=write_pos,
            use_qk_l2norm_in_kernel=config.use_qk_l2norm,
            lower_bound=config.gate_lower_bound,
        )
        if i in self.resident_layers:
            # first use: the layer's caches move to the device for good
            dev = self.resident.setdefault(i, {})
            kda_replay_decode(
                *inputs,
                initial_state=dev.setdefault("state", host.state.to(x)),
                d_cache=dev.setdefault("delta", host.delta.to(x)),
                k_cache=dev.setdefault("key", host.key.to(x)),
                g_cache=dev.setdefault("logdecay", host.logdecay.to(x)),  # expect-bug: decode-arg
                **options,
            )
        elif self.staging is not None:
            staging = self.staging
            staging.load(host)
            kda_replay_decode(
                *inputs,
                initial_state=staging.state,
                d_cache=staging.delta,
                k_cache=staging.key,
                g_cache=staging.logdecay,  # expect-bug: pool-dtype id=staging
                **options,
            )
            staging.store(host)
        else:
            state, delta, key, logdecay = (t.to(self.device, non_blocking=True) for t in host[:4])
            kda_replay_decode(
                *inputs, initial_state=state, d_cache=delta, k_cache=key, g_cache=logdecay, **options
            )
            for dst, src in zip(host[:4], (state, delta, key, logdecay)):
                if dst is not src:
                    dst.copy_(src)
        host.write_pos.copy_(advance_write_pos(write_pos, config.ring_len))
        return attn.proj(out.view(B, 1, -1))


def build_sequential_decode():
    """A bf16 model whose caches were moved to the host, decoded layer by layer."""
    torch.manual_seed(0)
    config = Config.from_name("kimi-kda-tiny-gqa")
    model = GPT(config).to(torch.bfloat16)
    model.set_kv_cache(batch_size=2)
    decoder = SequentialDecoder(model, host_rings_from_model(model))
    idx = torch.randint(0, config.padded_vocab_size, (2, 1))
    logits = []
    for _ in range(5):
        logits.append(decoder.step(idx))
        idx = logits[-1].argmax(-1)
    return {"rings": decoder.rings, "logits": torch.cat(logits, 1)}


def build_offloaded_decode():
    """Host caches with the first layer resident on the device and the others staged, plus the
    caches of a model materialized in bf16."""
    torch.manual_seed(0)
    config = Config.from_name("kimi-kda-tiny")
    model = GPT(config).to(torch.bfloat16)
    model.set_kv_cache(batch_size=2)
    decoder = SequentialDecoder(model, host_rings_from_model(model), resident_layers=[0], staging=True)
    idx = torch.randint(0, config.padded_vocab_size, (2, 1))
    for _ in range(3):
        idx = decoder.step(idx).argmax(-1)

    _, materialized = materialize(config, n_slots=2, dtype=torch.bfloat16)
    return {
        "rings": decoder.rings,
        "resident": decoder.resident,
        "staging": decoder.staging,
        "idx": idx,
        "materialized": materialized,
    }
