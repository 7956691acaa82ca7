# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""A generation engine colocated with the trainer (the ``vllm_mode="colocate"`` path).

The engine owns its own copy of the model, built in the engine dtype, and a
:class:`~trl_kda.extras.rollout_pool.RolloutRingPool` with the decode state of the sequences
it generates. The trainer pushes the policy weights into it before every generation round
(:meth:`ColocatedEngine.load_weights`) and may put it to sleep between rounds so the training
step gets the memory back: level 1 moves the decode state to host memory, level 2 writes it
to disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from trl_kda.extras.rollout_pool import PromptRingCache, RingGeometry, RolloutRingPool
from trl_kda.models.modeling_kda import TINY_MODEL_ID, KDAConfig, KDAForCausalLM, keep_params_in_fp32
from trl_kda.models.replayssm import fused_recurrent_kda_replayssm_decode
from trl_kda.trainer.utils import get_torch_dtype, resolve_cache_dtype, set_default_torch_dtype

__all__ = [
    "ColocatedEngine",
    "EngineArgs",
    "HostOffloader",
    "RequestOutput",
    "SamplingParams",
    "StaticDecodeRunner",
    "decode_step_on_pool",
]

SNAPSHOT_NAME = "replay_states.pt"


@dataclass
class EngineArgs:
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    gate_dtype: torch.dtype = torch.float32
    max_num_seqs: int = 4
    replay_ring_len: int = 4
    enable_sleep_mode: bool = False
    enable_prefix_caching: bool = False
    prefix_cache_capacity: int = 4
    offload_dtype: str | None = None
    seed: int = 0


@dataclass
class SamplingParams:
    max_tokens: int = 4
    temperature: float = 0.0
    n: int = 1


class RequestOutput(NamedTuple):
    prompt_token_ids: list[int]
    token_ids: list[int]


@torch.no_grad()
def decode_step_on_pool(
    model: KDAForCausalLM, pool: RolloutRingPool, token_ids: torch.Tensor, slots: torch.Tensor,
    force_flush: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step of ``model`` on the sequences of ``pool`` in ``slots``; returns logits.

    Rows with ``slot < 0`` are padding: they produce zeros and leave the pool untouched.
    """
    hidden = model.embed_tokens(token_ids)
    write_pos = pool.write_pos[slots.clamp(min=0).long()]
    for idx, layer in enumerate(model.layers):
        attn = layer.attn
        rings = pool.layer(idx)
        mixed_qkv, a, b = attn.project(layer.attn_norm(hidden))
        out = mixed_qkv.new_empty((token_ids.shape[0], 1, attn.num_v_heads, attn.v_head_dim))
        fused_recurrent_kda_replayssm_decode(
            mixed_qkv, a, b, attn.A_log, attn.dt_bias, attn.scale, initial_state=rings.state,
            d_cache=rings.delta_ring, k_cache=rings.key_ring, g_cache=rings.logdecay_ring, out=out,
            ssm_state_indices=slots, write_pos=write_pos, force_flush=force_flush,
            use_qk_l2norm_in_kernel=attn.use_qk_l2norm, lower_bound=attn.lower_bound,
        )
        hidden = hidden + attn.output(out, hidden)
        hidden = hidden + layer.mlp(layer.mlp_norm(hidden)).to(hidden.dtype)
    pool.advance(slots, force_flush)
    return model.lm_head(model.norm(hidden).to(model.lm_head.weight.dtype))


class HostOffloader:
    """Moves a pool's tensors to host memory and back (level-1 sleep).

    With ``host_dtype`` set, floating tensors are kept on the host in that dtype.
    """

    def __init__(self, host_dtype: torch.dtype | None = None) -> None:
        self.host_dtype = host_dtype
        self._stash: dict[str, torch.Tensor] = {}

    @property
    def holds_states(self) -> bool:
        return bool(self._stash)

    def offload(self, pool: RolloutRingPool) -> int:
        moved = 0
        for name, tensor in list(pool.named_states()):
            if self.host_dtype is not None and tensor.is_floating_point():
                host = tensor.to(device="cpu", dtype=self.host_dtype)  # expect-bug: cast id=host-offload
            else:
                host = tensor.to(device="cpu", copy=True)
            self._stash[name] = host
            moved += host.numel() * host.element_size()
            setattr(pool, name, tensor.new_empty(0))
        return moved

    def reload(self, pool: RolloutRingPool) -> None:
        for name, host in self._stash.items():
            setattr(pool, name, host.to(pool.device))  # expect-bug: cast id=host-offload
        self._stash.clear()


class ColocatedEngine:
    """Generates completions with a private model copy and a rollout ring pool."""

    def __init__(self, model_config: KDAConfig, args: EngineArgs | None = None) -> None:
        self.args = args or EngineArgs()
        self.dtype = get_torch_dtype(self.args.dtype) or get_torch_dtype(model_config.torch_dtype) or torch.float32
        self.cache_dtype = resolve_cache_dtype(self.args.kv_cache_dtype, self.dtype)
        self.geometry = RingGeometry.from_model_config(
            model_config, num_slots=self.args.max_num_seqs, ring_len=self.args.replay_ring_len
        )
        config = replace(model_config, preallocate_replay_cache=False, replay_ring_len=self.args.replay_ring_len)
        with set_default_torch_dtype(self.dtype):
            self.model = KDAForCausalLM(config)
            self.prefix_cache = (
                PromptRingCache(self.geometry, self.args.prefix_cache_capacity, dtype=self.cache_dtype)
                if self.args.enable_prefix_caching
                else None
            )
        keep_params_in_fp32(self.model, config.keep_in_fp32_params)
        self.model.eval().requires_grad_(False)
        self.pool = RolloutRingPool(self.geometry, dtype=self.cache_dtype, gate_dtype=self.args.gate_dtype)
        self.offloader = HostOffloader(get_torch_dtype(self.args.offload_dtype))
        self.sleep_level = 0
        self._snapshot_path: str | None = None
        self._generator = torch.Generator().manual_seed(self.args.seed)

    # -- weights --------------------------------------------------------------------------

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copies ``(name, tensor)`` pairs into the engine model; returns how many matched."""
        params = dict(self.model.named_parameters())
        loaded = 0
        for name, tensor in weights:
            target = params.get(name.removeprefix("module."))
            if target is None:
                continue
            target.copy_(tensor)
            loaded += 1
        return loaded

    # -- generation -----------------------------------------------------------------------

    def _sample(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        if temperature <= 0.0:
            return logits.float().argmax(dim=-1)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)

    def _prefill(self, prompts: Sequence[Sequence[int]], slots: torch.Tensor) -> torch.Tensor:
        """Runs the prompts through the pool; returns the logits after each prompt's last token."""
        count = len(prompts)
        start = [0] * count
        if self.prefix_cache is not None:
            for row, prompt in enumerate(prompts):
                hit = self.prefix_cache.lookup(prompt[:-1])
                if hit is not None:
                    self.prefix_cache.copy_to(hit, self.pool, slots[row : row + 1])
                    start[row] = len(prompt) - 1
        last = torch.zeros(count, self.model.config.vocab_size)
        for t in range(max(len(p) for p in prompts)):
            active = [start[row] <= t < len(prompts[row]) for row in range(count)]
            if not any(active):
                continue
            tokens = torch.tensor([prompts[row][t] if active[row] else 0 for row in range(count)])
            step_slots = torch.where(torch.tensor(active), slots, torch.full_like(slots, -1))
            logits = decode_step_on_pool(self.model, self.pool, tokens, step_slots)
            for row in range(count):
                if active[row] and t == len(prompts[row]) - 1:
                    last[row] = logits[row].float()
                if self.prefix_cache is not None and active[row] and t == len(prompts[row]) - 2:
                    self.prefix_cache.insert(prompts[row][:-1], self.pool, int(slots[row]))
        return last

    def _generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[RequestOutput]:
        expanded = [list(p) for p in prompts for _ in range(params.n)]
        slots = self.pool.allocate(len(expanded))
        self.pool.reset_slots(slots)
        try:
            logits = self._prefill(expanded, slots)
            generated: list[list[int]] = [[] for _ in expanded]
            for _ in range(params.max_tokens):
                tokens = self._sample(logits, params.temperature)
                for row, token in enumerate(tokens.tolist()):
                    generated[row].append(token)
                logits = decode_step_on_pool(self.model, self.pool, tokens, slots).float()
        finally:
            self.pool.release(slots)
        return [RequestOutput(prompt, tokens) for prompt, tokens in zip(expanded, generated, strict=True)]

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling_params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        if self.sleep_level:
            raise RuntimeError("the engine is asleep; call wake_up() first")
        params = sampling_params or SamplingParams()
        per_batch = max(1, self.args.max_num_seqs // params.n)
        outputs: list[RequestOutput] = []
        for start in range(0, len(prompts), per_batch):
            outputs.extend(self._generate_batch(prompts[start : start + per_batch], params))
        return outputs

    # -- sleep mode -----------------------------------------------------------------------

    def _save_snapshot(self, path: str) -> None:
        states = {name: t.to(self.dtype) if t.is_floating_point() else t for name, t in self.pool.named_states()}  # expect-bug: load id=wake-snapshot
        torch.save(states, path)

    def sleep(self, level: int = 1, snapshot_dir: str | None = None) -> None:
        """Frees the decode state: level 1 keeps it in host memory, level 2 on disk."""
        if not self.args.enable_sleep_mode:
            raise RuntimeError("sleep mode is disabled (EngineArgs.enable_sleep_mode)")
        if level == 1:
            self.offloader.offload(self.pool)
        elif level == 2:
            if snapshot_dir is None:
                raise ValueError("level-2 sleep needs a snapshot_dir")
            self._snapshot_path = os.path.join(snapshot_dir, SNAPSHOT_NAME)
            self._save_snapshot(self._snapshot_path)
            for name, tensor in list(self.pool.named_states()):
                setattr(self.pool, name, tensor.new_empty(0))
        else:
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        self.sleep_level = level

    def wake_up(self) -> None:
        if self.sleep_level == 1:
            self.offloader.reload(self.pool)
        elif self.sleep_level == 2:
            assert self._snapshot_path is not None
            states = torch.load(self._snapshot_path, weights_only=True)  # expect-bug: load id=wake-snapshot
            for name, tensor in states.items():
                setattr(self.pool, name, tensor.to(self.pool.device))  # expect-bug: load id=wake-snapshot
        self.sleep_level = 0

    def reset_prefix_cache(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.clear()


class StaticDecodeRunner:
    """Replays decode steps on fixed input buffers, the way a captured CUDA graph runs.

    Every tensor the kernel reads or writes is bound once in :meth:`capture`; a replay copies
    the new token ids and slots into the static buffers and runs the layers.
    """

    def __init__(self, engine: ColocatedEngine, batch_size: int) -> None:
        self.engine = engine
        self.batch_size = batch_size
        self.input_ids = torch.zeros(batch_size, dtype=torch.long)
        self.slots = torch.zeros(batch_size, dtype=torch.int32)
        self.row_write_pos = torch.zeros(batch_size, dtype=torch.int32)
        self.static_inputs: list[dict[str, Any]] = []
        self.capture()

    def capture(self) -> None:
        self.static_inputs.clear()
        for idx, layer in enumerate(self.engine.model.layers):
            attn = layer.attn
            rings = self.engine.pool.layer(idx)
            self.static_inputs.append(
                {
                    "A_log": attn.A_log,
                    "dt_bias": attn.dt_bias,
                    "scale": attn.scale,
                    "initial_state": rings.state,
                    "d_cache": rings.delta_ring,
                    "k_cache": rings.key_ring,
                    "g_cache": rings.logdecay_ring.to(self.engine.dtype),  # expect-bug: decode-arg
                    "ssm_state_indices": self.slots,
                    "write_pos": self.row_write_pos,
                    "use_qk_l2norm_in_kernel": attn.use_qk_l2norm,
                    "lower_bound": attn.lower_bound,
                }
            )

    @torch.no_grad()
    def replay(self, token_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        model, pool = self.engine.model, self.engine.pool
        self.input_ids.copy_(token_ids)
        self.slots.copy_(slots)
        self.row_write_pos.copy_(pool.write_pos[self.slots.long()])
        hidden = model.embed_tokens(self.input_ids)
        for layer, static in zip(model.layers, self.static_inputs, strict=True):
            attn = layer.attn
            mixed_qkv, a, b = attn.project(layer.attn_norm(hidden))
            out = mixed_qkv.new_empty((self.batch_size, 1, attn.num_v_heads, attn.v_head_dim))
            fused_recurrent_kda_replayssm_decode(mixed_qkv=mixed_qkv, a=a, b=b, out=out, **static)
            hidden = hidden + attn.output(out, hidden)
            hidden = hidden + layer.mlp(layer.mlp_norm(hidden)).to(hidden.dtype)
        pool.advance(self.slots)
        return model.lm_head(model.norm(hidden).to(model.lm_head.weight.dtype))


PROMPTS = [[3, 1, 4, 1], [5, 9, 2], [6, 5, 3, 5, 8]]


def _synced_engine(args: EngineArgs, policy_dtype: str = "float32") -> ColocatedEngine:
    policy = KDAForCausalLM.from_pretrained(TINY_MODEL_ID, torch_dtype=policy_dtype)
    engine = ColocatedEngine(policy.config, args)
    engine.load_weights(policy.named_parameters())
    return engine


def build_engine_generate_and_sleep() -> ColocatedEngine:
    """A bf16 engine: generate, level-1 sleep and wake-up, generate again."""
    engine = _synced_engine(EngineArgs(dtype="bfloat16", enable_sleep_mode=True, max_num_seqs=3))
    engine.generate(PROMPTS, SamplingParams(max_tokens=3))
    engine.sleep(level=1)
    engine.wake_up()
    engine.generate(PROMPTS[:2], SamplingParams(max_tokens=2))
    return engine


def build_engine_weight_sync() -> dict[str, Any]:
    """An fp16 engine fed from a prepared bf16 policy, sampling two completions per prompt."""
    from trl_kda.accelerate_utils import Accelerator
    from trl_kda.models.utils import unwrap_model_for_generation

    accelerator = Accelerator(mixed_precision="bf16")
    policy = KDAForCausalLM.from_pretrained(TINY_MODEL_ID, torch_dtype="bfloat16", seed=3)
    prepared = accelerator.prepare(policy)
    engine = ColocatedEngine(policy.config, EngineArgs(dtype="float16", kv_cache_dtype="auto", seed=5))
    with unwrap_model_for_generation(prepared, accelerator) as unwrapped:
        engine.load_weights(unwrapped.named_parameters())
    outputs = engine.generate(PROMPTS[:2], SamplingParams(max_tokens=3, temperature=1.0, n=2))
    completions = torch.tensor([out.token_ids for out in outputs])
    return {"engine": engine, "completion_ids": completions}


def build_engine_sleep_modes(tmp_dir: str) -> dict[str, RolloutRingPool]:
    """A bf16 engine offloading to host in bf16, and one sleeping to disk (level 2)."""
    host = _synced_engine(EngineArgs(dtype="bfloat16", enable_sleep_mode=True, offload_dtype="bfloat16"))
    host.generate(PROMPTS[:2], SamplingParams(max_tokens=2))
    host.sleep(level=1)
    host.wake_up()
    host.generate(PROMPTS[1:], SamplingParams(max_tokens=2))

    disk = _synced_engine(EngineArgs(dtype="bfloat16", enable_sleep_mode=True))
    disk.generate(PROMPTS, SamplingParams(max_tokens=2))
    disk.sleep(level=2, snapshot_dir=tmp_dir)
    disk.wake_up()
    disk.generate(PROMPTS[:1], SamplingParams(max_tokens=2))
    return {"host_offload": host.pool, "disk_offload": disk.pool}


def build_engine_prefix_cache() -> ColocatedEngine:
    """A bf16 engine with prefix caching, sampling each prompt twice."""
    engine = _synced_engine(EngineArgs(dtype="bfloat16", enable_prefix_caching=True, prefix_cache_capacity=3))
    engine.generate(PROMPTS, SamplingParams(max_tokens=2, n=2))
    engine.generate(PROMPTS[:2], SamplingParams(max_tokens=2, n=2))
    return engine


def build_static_runner() -> StaticDecodeRunner:
    """Three replays of a captured two-sequence decode step on a bf16 engine."""
    engine = _synced_engine(EngineArgs(dtype="bfloat16", max_num_seqs=2))
    runner = StaticDecodeRunner(engine, batch_size=2)
    slots = engine.pool.allocate(2)
    tokens = torch.tensor([1, 2])
    for _ in range(3):
        tokens = runner.replay(tokens, slots).float().argmax(dim=-1)
    return runner
