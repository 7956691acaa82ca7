# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""Group Relative Policy Optimization for KDA models.

Each step samples ``num_generations`` completions per prompt, scores them with the reward
functions, normalises the rewards within each prompt's group into advantages and takes a
clipped policy-gradient step with an optional KL penalty against a reference model.

Completions come from the colocated engine (``use_vllm``, ``vllm_mode="colocate"``), from a
generation server through :class:`~trl_kda.extras.vllm_client.VLLMClient` (``"server"``), or,
without vLLM, from a decoding copy of the policy with preallocated ReplaySSM buffers. With
``prefill_with_policy`` the prompts are prefilled by the training model itself and the
engine continues from the rings it hands over.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from trl_kda.accelerate_utils import Accelerator, is_deepspeed_zero3_enabled
from trl_kda.extras.colocate_engine import ColocatedEngine, EngineArgs, SamplingParams, decode_step_on_pool
from trl_kda.extras.rollout_pool import RingGeometry, RolloutRingPool
from trl_kda.extras.vllm_client import Transport, VLLMClient
from trl_kda.models.modeling_kda import TINY_MODEL_ID, KDAAttention, KDAForCausalLM
from trl_kda.models.utils import (
    create_reference_model,
    disable_dropout_in_model,
    prepare_deepspeed,
    unwrap_model_for_generation,
)
from trl_kda.trainer.grpo_config import GRPOConfig
from trl_kda.trainer.utils import (
    get_torch_dtype,
    nanstd,
    pad,
    rollout_cache_dtypes,
    selective_log_softmax,
    to_engine_layout,
)

RewardFunc = Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]]], list[float]]


def _prefill_rows(
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    prompts: list[list[int]],
    slots: torch.Tensor,
    vocab_size: int,
) -> torch.Tensor:
    """Feeds prompts of different lengths token by token; returns each prompt's last logits."""
    logits = torch.zeros(len(prompts), vocab_size)
    for t in range(max(len(p) for p in prompts)):
        active = torch.tensor([t < len(p) for p in prompts])
        tokens = torch.tensor([p[t] if t < len(p) else 0 for p in prompts])
        out = step(tokens, torch.where(active, slots, torch.full_like(slots, -1))).float()
        done = torch.tensor([t == len(p) - 1 for p in prompts])
        logits[done] = out[done]
    return logits


class GRPOTrainer:
    """Trainer for GRPO on a :class:`KDAForCausalLM` (or the id of one)."""

    _tag_names = ["trl", "grpo"]

    def __init__(
        self,
        model: str | KDAForCausalLM,
        reward_funcs: RewardFunc | list[RewardFunc],
        args: GRPOConfig | None = None,
        ref_model: KDAForCausalLM | None = None,
        accelerator: Accelerator | None = None,
        vllm_transport: Transport | None = None,
    ) -> None:
        self.args = args or GRPOConfig()
        self.accelerator = accelerator or Accelerator(mixed_precision=self.args.mixed_precision)
        if isinstance(model, str):
            model = self._create_model_from_path(model)
        elif self.args.model_init_kwargs is not None:
            raise ValueError("model_init_kwargs is only used when the model is given as an id")
        if self.args.disable_dropout:
            disable_dropout_in_model(model)
        self.model = self.accelerator.prepare(model)
        unwrapped = self.accelerator.unwrap_model(self.model)
        self.model_dtype = unwrapped.dtype

        self.reward_funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        weights = self.args.reward_weights or [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError("reward_weights must have one weight per reward function")
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)
        self.ref_model = self._create_ref_model(unwrapped, ref_model)

        self.geometry = RingGeometry.from_model_config(
            unwrapped.config, num_slots=self.args.vllm_max_num_seqs, ring_len=self.args.vllm_replay_ring_len
        )
        self.engine: ColocatedEngine | None = None
        self.vllm_client: VLLMClient | None = None
        self.generation_model: KDAForCausalLM | None = None
        self.rollout_buffers: RolloutRingPool | None = None
        if self.args.use_vllm and self.args.vllm_mode == "colocate":
            self.engine = ColocatedEngine(
                unwrapped.config,
                EngineArgs(
                    dtype=self.args.vllm_dtype,
                    kv_cache_dtype=self.args.vllm_kv_cache_dtype,
                    gate_dtype=self.args.replay_gate_dtype,
                    max_num_seqs=self.args.vllm_max_num_seqs,
                    replay_ring_len=self.args.vllm_replay_ring_len,
                    enable_sleep_mode=self.args.vllm_enable_sleep_mode,
                    seed=self.args.seed,
                ),
            )
        elif self.args.use_vllm:
            if vllm_transport is None:
                raise ValueError("vllm_mode='server' needs a vllm_transport")
            self.vllm_client = VLLMClient(vllm_transport)
            self.rollout_buffers = RolloutRingPool.from_buffer_dtypes(self.geometry, self.args.rollout_buffer_dtypes)  # expect-bug: container id=buffer-dtypes
        else:
            self.generation_model = self._create_generation_model(unwrapped)

        self.prompt_pool: RolloutRingPool | None = None
        if self.args.prefill_with_policy:
            if self.engine is None:
                raise ValueError("prefill_with_policy needs the colocated engine")
            delta_dtype, key_dtype, decay_dtype = rollout_cache_dtypes(self.accelerator.mixed_precision, self.model_dtype)
            self.prompt_pool = RolloutRingPool(self.geometry, delta_dtype, key_dtype=key_dtype, gate_dtype=decay_dtype)  # expect-bug: imported-policy id=rollout-calc

        self._generator = torch.Generator().manual_seed(self.args.seed)
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self.state_step = 0

    # -- setup ----------------------------------------------------------------------------

    def _create_model_from_path(self, model_id: str) -> KDAForCausalLM:
        model_init_kwargs = dict(self.args.model_init_kwargs or {})
        torch_dtype = model_init_kwargs.get("torch_dtype", "auto")
        if isinstance(torch_dtype, str) and torch_dtype != "auto":
            torch_dtype = get_torch_dtype(torch_dtype)
        elif not (torch_dtype == "auto" or torch_dtype is None or isinstance(torch_dtype, torch.dtype)):
            raise ValueError(f"invalid torch_dtype in model_init_kwargs: {torch_dtype!r}")
        model_init_kwargs["torch_dtype"] = torch_dtype
        return KDAForCausalLM.from_pretrained(model_id, seed=self.args.seed, **model_init_kwargs)

    def _create_ref_model(self, unwrapped: KDAForCausalLM, ref_model: KDAForCausalLM | None) -> Any:
        if self.args.beta == 0.0:
            return None
        if ref_model is None:
            ref_model = create_reference_model(unwrapped)
        if self.accelerator.state.deepspeed_plugin is not None or is_deepspeed_zero3_enabled(self.accelerator):
            return prepare_deepspeed(ref_model, self.accelerator)
        return ref_model.eval()

    def _create_generation_model(self, unwrapped: KDAForCausalLM) -> KDAForCausalLM:
        """A decoding copy of the policy with preallocated rings, mixers in ``generation_dtype``.

        Embeddings, norms and the LM head stay in the policy's dtype; the KDA mixers run in
        ``generation_dtype`` (default: the policy's).
        """
        slots = self.args.per_device_train_batch_size * self.args.num_generations
        config = replace(
            unwrapped.config,
            preallocate_replay_cache=True,
            max_replay_slots=slots,
            replay_ring_len=self.args.vllm_replay_ring_len,
        )
        generation_model = KDAForCausalLM(config)
        generation_model.load_state_dict(unwrapped.state_dict(), strict=False)
        dtype = get_torch_dtype(self.args.generation_dtype) or self.model_dtype
        for module in generation_model.modules():
            if isinstance(module, KDAAttention):
                module.to(dtype)  # expect-bug: module-cast
        return generation_model.eval().requires_grad_(False)

    # -- generation -----------------------------------------------------------------------

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        if self.args.temperature <= 0.0:
            return logits.float().argmax(dim=-1)
        probs = torch.softmax(logits.float() / self.args.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)

    def _move_model_to_vllm(self) -> None:
        assert self.engine is not None
        with unwrap_model_for_generation(self.model, self.accelerator) as unwrapped:
            if self.engine.sleep_level:
                self.engine.wake_up()
            self.engine.load_weights(unwrapped.named_parameters())
            self.engine.reset_prefix_cache()

    @torch.no_grad()
    def _generate_with_model(self, prompts: list[list[int]]) -> list[list[int]]:
        model = self.generation_model
        assert model is not None
        for _, buffer in model.named_buffers():
            buffer.zero_()
        slots = torch.arange(len(prompts), dtype=torch.int32)
        logits = _prefill_rows(model.decode_step, prompts, slots, model.config.vocab_size)
        completions: list[list[int]] = [[] for _ in prompts]
        for _ in range(self.args.max_completion_length):
            tokens = self._sample(logits)
            for row, token in enumerate(tokens.tolist()):
                completions[row].append(token)
            logits = model.decode_step(tokens, slots).float()
        return completions

    def _handoff_prompt_rings(self) -> None:
        """Gives the engine the rings the policy prefilled (same slots, engine layout)."""
        assert self.engine is not None and self.prompt_pool is not None
        source, target = self.prompt_pool, self.engine.pool
        target.state = to_engine_layout(source.state)
        target.delta_ring = to_engine_layout(source.delta_ring, self.engine.cache_dtype)
        target.key_ring = to_engine_layout(source.key_ring, self.engine.cache_dtype)
        target.logdecay_ring = to_engine_layout(source.logdecay_ring, self.engine.cache_dtype)  # expect-bug: cast id=engine-layout
        target.write_pos = to_engine_layout(source.write_pos)

    @torch.no_grad()
    def _generate_from_policy_prefill(self, prompts: list[list[int]]) -> list[list[int]]:
        assert self.engine is not None and self.prompt_pool is not None
        policy = self.accelerator.unwrap_model(self.model)
        slots = self.prompt_pool.allocate(len(prompts))
        self.prompt_pool.reset_slots(slots)
        prompt_pool = self.prompt_pool
        step = lambda tokens, rows: decode_step_on_pool(policy, prompt_pool, tokens, rows)  # noqa: E731
        logits = _prefill_rows(step, prompts, slots, policy.config.vocab_size)
        self._handoff_prompt_rings()
        engine_slots = self.engine.pool.allocate(len(prompts))
        if not torch.equal(engine_slots, slots):
            raise RuntimeError("the engine and the prompt pool disagree on free slots")
        completions: list[list[int]] = [[] for _ in prompts]
        try:
            for _ in range(self.args.max_completion_length):
                tokens = self._sample(logits)
                for row, token in enumerate(tokens.tolist()):
                    completions[row].append(token)
                logits = decode_step_on_pool(self.engine.model, self.engine.pool, tokens, slots).float()
        finally:
            self.engine.pool.release(slots)
            self.prompt_pool.release(slots)
        return completions

    def generate_completions(self, prompts: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
        """``num_generations`` completions of each prompt; returns ``(prompts, completions)``."""
        expanded = [list(p) for p in prompts for _ in range(self.args.num_generations)]
        if self.engine is not None:
            self._move_model_to_vllm()
            if self.prompt_pool is not None:
                completions = self._generate_from_policy_prefill(expanded)
            else:
                params = SamplingParams(max_tokens=self.args.max_completion_length, temperature=self.args.temperature)
                completions = [out.token_ids for out in self.engine.generate(expanded, params)]
            if self.args.vllm_enable_sleep_mode:
                self.engine.sleep(level=1)
        elif self.vllm_client is not None:
            self.vllm_client.update_model_params(self.accelerator.unwrap_model(self.model))
            completions = self.vllm_client.generate(
                [list(p) for p in prompts], self.args.max_completion_length, self.args.num_generations
            )
        else:
            completions = self._generate_with_model(expanded)
        return expanded, completions

    # -- scoring and loss -----------------------------------------------------------------

    def _compute_rewards(self, prompts: list[list[int]], completions: list[list[int]]) -> torch.Tensor:
        columns = [torch.tensor(func(prompts, completions), dtype=torch.float32) for func in self.reward_funcs]
        return (torch.stack(columns, dim=1) * self.reward_weights).nansum(dim=1)

    def _compute_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        grouped = rewards.view(-1, self.args.num_generations)
        mean = grouped.mean(dim=1, keepdim=True)
        advantages = grouped - mean
        if self.args.scale_rewards:
            advantages = advantages / (grouped.std(dim=1, keepdim=True) + 1e-4)
        self._metrics["reward"].append(float(rewards.mean()))
        self._metrics["reward_std"].append(float(nanstd(rewards)))
        return advantages.reshape(-1)

    def _per_token_logps(self, model: Any, input_ids: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
        logits = model(input_ids)[:, :-1]
        logits = logits[:, -logits_to_keep:]
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:])

    def compute_loss(self, prompts: list[list[int]], completions: list[list[int]], advantages: torch.Tensor) -> torch.Tensor:
        sequences = [torch.tensor(p + c) for p, c in zip(prompts, completions, strict=True)]
        input_ids = pad(sequences, padding_value=0, padding_side="left")
        keep = max(len(c) for c in completions)
        logps = self._per_token_logps(self.model, input_ids, keep)
        old_logps = logps.detach()
        ratio = torch.exp(logps - old_logps)
        clipped = torch.clamp(ratio, 1 - self.args.epsilon, 1 + (self.args.epsilon_high or self.args.epsilon))
        per_token = -torch.min(ratio * advantages.unsqueeze(1), clipped * advantages.unsqueeze(1))
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logps = self._per_token_logps(self.ref_model, input_ids, keep)
            diff = ref_logps - logps
            per_token = per_token + self.args.beta * (torch.exp(diff) - diff - 1)
        return per_token.mean()

    def training_step(self, prompts: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        expanded, completions = self.generate_completions(prompts)
        rewards = self._compute_rewards(expanded, completions)
        advantages = self._compute_advantages(rewards)
        loss = self.compute_loss(expanded, completions, advantages)
        loss.backward()
        with torch.no_grad():
            for param in self.model.parameters():
                if param.grad is not None:
                    param.add_(param.grad.to(param.dtype), alpha=-self.args.learning_rate)
                    param.grad = None
        self.state_step += 1
        return {"loss": loss.detach(), "rewards": rewards, "advantages": advantages}


def _length_reward(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list[float]:
    return [float(len(set(c))) / max(len(c), 1) for c in completions]


def _even_token_reward(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list[float]:
    return [sum(1.0 for token in c if token % 2 == 0) for c in completions]


PROMPTS = [[3, 1, 4], [2, 7, 1, 8]]


def build_grpo_trainer() -> dict[str, Any]:
    """One GRPO step of a bf16 policy generating through a sleeping colocated engine."""
    args = GRPOConfig(
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=3,
        temperature=1.0,
        model_init_kwargs={"torch_dtype": "bfloat16"},
        vllm_enable_sleep_mode=True,
        reward_weights=[1.0, 0.5],
    )
    trainer = GRPOTrainer(TINY_MODEL_ID, reward_funcs=[_length_reward, _even_token_reward], args=args)
    metrics = trainer.training_step(PROMPTS)
    assert trainer.engine is not None
    trainer.engine.wake_up()
    return {"engine": trainer.engine, **metrics}


def build_grpo_trainer_policy_prefill() -> dict[str, Any]:
    """Generation without vLLM (mixers in bf16), and a bf16 run whose policy prefills prompts."""
    no_vllm = GRPOTrainer(
        TINY_MODEL_ID,
        reward_funcs=_length_reward,
        args=GRPOConfig(
            use_vllm=False,
            beta=0.0,
            temperature=0.0,
            generation_dtype="bfloat16",
            model_init_kwargs={"torch_dtype": "float32"},
        ),
    )
    no_vllm.training_step(PROMPTS)

    prefill = GRPOTrainer(
        TINY_MODEL_ID,
        reward_funcs=_even_token_reward,
        args=GRPOConfig(
            bf16=True,
            prefill_with_policy=True,
            vllm_dtype="bfloat16",
            model_init_kwargs={"torch_dtype": "float32"},
        ),
    )
    _, completions = prefill.generate_completions(PROMPTS)
    assert prefill.engine is not None
    return {
        "generation_model": no_vllm.generation_model,
        "prompt_pool": prefill.prompt_pool,
        "engine_pool": prefill.engine.pool,
        "completion_ids": torch.tensor(completions),
    }
