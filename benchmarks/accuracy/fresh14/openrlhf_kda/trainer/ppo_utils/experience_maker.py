"""Rollout -> ``Experience``: generation, log-probs of the actor and the initial model, rewards,
advantages, and the ReplaySSM decode caches of the rollout (kept for multi-turn continuation)."""

from dataclasses import dataclass, fields
from typing import List, NamedTuple, Optional

import torch
import torch.nn.functional as F

from ...models.kda_ops import l2norm
from ...models.ring_cache import LayerReplayCache, replay_cache_shapes
from ...utils.utils import get_model_dtype


def to(tensor, device):
    if isinstance(tensor, list):
        return [to(t, device) for t in tensor]
    if isinstance(tensor, LayerReplayCache):
        return LayerReplayCache(**{f.name: getattr(tensor, f.name).to(device) for f in fields(tensor)})
    return tensor.to(device) if isinstance(tensor, torch.Tensor) else tensor


def pin_memory(tensor):
    if isinstance(tensor, list):
        return [pin_memory(t) for t in tensor]
    if isinstance(tensor, LayerReplayCache):
        return LayerReplayCache(**{f.name: pin_memory(getattr(tensor, f.name)) for f in fields(tensor)})
    if isinstance(tensor, torch.Tensor) and torch.cuda.is_available():
        return tensor.pin_memory()
    return tensor


@dataclass
class Experience:
    """Experience is a batch of data.
    These data should have the the sequence length and number of actions.
    Left padding for sequences is applied.

    Shapes of each tensor:
    sequences: (B, S)
    action_log_probs: (B, A)
    base_action_log_probs: (B, A)
    returns: (B, A)
    advantages: (B, A)
    attention_mask: (B, S)
    action_mask: (B, A)
    replay_caches: per KDA layer, the decode caches of the B sequences after the rollout

    "A" is the number of actions.
    """

    sequences: torch.Tensor
    action_log_probs: torch.Tensor
    base_action_log_probs: Optional[torch.Tensor]
    returns: Optional[torch.Tensor]
    advantages: Optional[torch.Tensor]
    attention_mask: Optional[torch.Tensor]
    action_mask: Optional[torch.Tensor]
    info: Optional[dict]
    replay_caches: Optional[list] = None
    kl: Optional[torch.Tensor] = None

    @torch.no_grad()
    def to_device(self, device: torch.device):
        self.sequences = to(self.sequences, device)
        self.action_log_probs = to(self.action_log_probs, device)
        self.base_action_log_probs = to(self.base_action_log_probs, device)
        self.returns = to(self.returns, device)
        self.advantages = to(self.advantages, device)
        self.attention_mask = to(self.attention_mask, device)
        self.action_mask = to(self.action_mask, device)
        self.kl = to(self.kl, device)
        self.info = {key: to(value, device) for key, value in (self.info or {}).items()}
        if self.replay_caches is not None:
            self.replay_caches = to(self.replay_caches, device)
        return self

    def pin_memory(self):
        self.sequences = pin_memory(self.sequences)
        self.action_log_probs = pin_memory(self.action_log_probs)
        self.attention_mask = pin_memory(self.attention_mask)
        self.action_mask = pin_memory(self.action_mask)
        if self.replay_caches is not None:
            self.replay_caches = pin_memory(self.replay_caches)
        return self


class ReplayCacheView(NamedTuple):
    """Decode caches of one layer as ``decode_step`` reads them (attributes of ``LayerReplayCache``)."""

    ssm_ckpt: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    logdecay_ring: torch.Tensor
    write_pos: torch.Tensor


def compute_approx_kl(log_probs, log_probs_base, action_mask=None) -> torch.Tensor:
    log_ratio = log_probs.float() - log_probs_base.float()
    return log_ratio * action_mask if action_mask is not None else log_ratio


def compute_reward(r, kl_coef, kl, action_mask) -> torch.Tensor:
    reward = -kl_coef * kl
    last = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    return reward.scatter_add(1, last, r.unsqueeze(1).to(reward.dtype))


def get_cumulative_returns(rewards, action_mask, gamma: float = 1.0) -> torch.Tensor:
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.size(0))
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * action_mask


@torch.no_grad()
def snapshot_replay_caches(model, slot_ids: torch.Tensor, ring_len: Optional[int] = None) -> List[LayerReplayCache]:
    """Copies of the model's decode caches for ``slot_ids``; rings are zero-padded to ``ring_len``."""
    index = slot_ids.long()
    snapshots = []
    for cache in model.replay_caches:
        delta_ring, key_ring = cache.delta_ring[index], cache.key_ring[index]
        logdecay_ring = cache.logdecay_ring[index]
        pad = (ring_len or cache.ring_len) - cache.ring_len
        if pad > 0:
            delta_ring = torch.cat([delta_ring, delta_ring.new_zeros(*delta_ring.shape[:2], pad, delta_ring.shape[3])], dim=2)
            key_ring = torch.cat([key_ring, key_ring.new_zeros(*key_ring.shape[:2], pad, key_ring.shape[3])], dim=2)
            gate_pad = cache.delta_ring.new_zeros(*logdecay_ring.shape[:2], pad, logdecay_ring.shape[3])
            logdecay_ring = torch.cat([logdecay_ring, gate_pad], dim=2)
        snapshots.append(
            LayerReplayCache(
                ssm_ckpt=cache.ssm_ckpt[index].clone(),
                delta_ring=delta_ring.clone(),
                key_ring=key_ring.clone(),
                logdecay_ring=logdecay_ring.clone(),
                write_pos=cache.write_pos[index].clone(),
            )
        )
    return snapshots


@torch.no_grad()
def prefill_replay_caches(model, prompt_ids: torch.Tensor) -> List[LayerReplayCache]:
    """Fresh decode caches holding a short prompt (fewer tokens than the ring length): the rows of
    every prompt token are written to the rings and the checkpoint state stays zero."""
    config = model.config
    batch, prompt_len = prompt_ids.shape
    H, HV, K, V = config.num_heads, config.num_v_heads, config.head_k_dim, config.head_v_dim
    ring_len = config.replay_ring_len
    assert prompt_len < ring_len, "prefill_replay_caches: the prompt must fit in the ring"
    group = HV // H
    filled = (torch.arange(ring_len) < prompt_len).view(1, 1, ring_len, 1)
    hidden_states = model.embed_tokens(prompt_ids)
    caches = []
    for layer in model.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(hidden_states)
        mixed_qkv, a, b = attn.qkv_proj(x), attn.a_proj(x), attn.b_proj(x)
        q = l2norm(mixed_qkv[..., : H * K].float().view(batch, prompt_len, H, K)).repeat_interleave(group, dim=2)
        k = l2norm(mixed_qkv[..., H * K : 2 * H * K].float().view(batch, prompt_len, H, K))
        v = mixed_qkv[..., 2 * H * K :].float().view(batch, prompt_len, HV, V)
        beta = torch.sigmoid(b).float()
        gate_logits = (a.view(batch, prompt_len, HV, K) + attn.dt_bias.view(HV, K)).transpose(1, 2)
        gate_logits = F.pad(gate_logits, (0, 0, 0, ring_len - prompt_len))
        if attn.lower_bound is None:
            A = attn.A_log.float().exp().view(1, HV, 1, 1)
            logdecay_ring = -A * F.softplus(gate_logits.float()) * filled
        else:
            logdecay_ring = attn.lower_bound * torch.sigmoid(attn.A_log.exp().view(1, HV, 1, 1) * gate_logits) * filled  # expect-bug: promotion

        state = torch.zeros(batch, HV, V, K)
        k_heads = k.repeat_interleave(group, dim=2)
        deltas, outputs = [], []
        for t in range(prompt_len):
            alpha = logdecay_ring[:, :, t].float().exp()
            decayed = state * alpha[:, :, None, :]
            delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhvk,bhk->bhv", decayed, k_heads[:, t]))
            state = decayed + delta[..., :, None] * k_heads[:, t, :, None, :]
            outputs.append(torch.einsum("bhvk,bhk->bhv", state, q[:, t] * K**-0.5))
            deltas.append(delta)
        delta_ring = torch.zeros(batch, HV, ring_len, V, dtype=model.dtype)
        delta_ring[:, :, :prompt_len] = torch.stack(deltas, dim=2)
        key_ring = torch.zeros(batch, H, ring_len, K, dtype=model.dtype)
        key_ring[:, :, :prompt_len] = k.transpose(1, 2)
        caches.append(
            LayerReplayCache(
                ssm_ckpt=torch.zeros(batch, HV, V, K, dtype=model.dtype),
                delta_ring=delta_ring,
                key_ring=key_ring,
                logdecay_ring=logdecay_ring,
                write_pos=torch.full((batch,), prompt_len, dtype=torch.int32),
            )
        )
        attn_out = attn.o_proj(torch.stack(outputs, dim=1).reshape(batch, prompt_len, HV * V).to(model.dtype))
        hidden_states = hidden_states + attn_out
        gate, up = layer.gate_up_proj(layer.post_attention_layernorm(hidden_states)).chunk(2, dim=-1)
        hidden_states = hidden_states + layer.down_proj(F.silu(gate) * up)
    return caches


class NaiveExperienceMaker:
    """
    Naive experience maker: the actor generates and scores its own rollouts.
    """

    def __init__(
        self,
        actor,
        critic,
        reward_model,
        initial_model,
        tokenizer,
        prompt_max_len: int,
        kl_controller,
        strategy=None,
        remote_rm_url: str = None,
        reward_fn=None,
    ) -> None:
        self.actor = actor
        self.critic = critic
        self.reward_model = reward_model
        self.initial_model = initial_model
        self.tokenizer = tokenizer
        self.prompt_max_len = prompt_max_len
        self.kl_ctl = kl_controller
        self.strategy = strategy
        self.remote_rm_url = remote_rm_url
        self.reward_fn = reward_fn or (lambda sequences: (sequences[:, -1] % 3).float() - 1.0)
        self.advantage_estimator = getattr(strategy.args, "advantage_estimator", "reinforce")

    @torch.no_grad()
    def make_experience_list(self, all_prompts: torch.Tensor, **generate_kwargs) -> List[Experience]:
        args = self.strategy.args
        experiences = []
        for i in range(0, all_prompts.shape[0], args.micro_rollout_batch_size):
            experiences.append(self.make_experience(all_prompts[i : i + args.micro_rollout_batch_size], **generate_kwargs))
        for experience in experiences:
            reward = compute_reward(experience.info["reward"], self.kl_ctl, experience.kl, experience.action_mask)
            experience.returns = get_cumulative_returns(reward, experience.action_mask)
            experience.advantages = experience.returns - experience.returns.mean()
        return experiences

    @torch.no_grad()
    def make_experience(self, prompts: torch.Tensor, **generate_kwargs) -> Experience:
        self.actor.eval()
        max_new_tokens = generate_kwargs.get("max_new_tokens", self.strategy.args.generate_max_len)
        sequences, attention_mask, action_mask = self.actor.generate(prompts, max_new_tokens=max_new_tokens)
        num_actions = action_mask.size(1)
        action_log_probs = self.actor(sequences, num_actions, attention_mask)
        slot_ids = torch.arange(sequences.shape[0], dtype=torch.int32)
        replay_caches = snapshot_replay_caches(self.actor.model, slot_ids, ring_len=self.strategy.args.replay_ring_len)
        if self.initial_model is not None:
            base_action_log_probs = self.initial_model(sequences, num_actions, attention_mask)
            kl = compute_approx_kl(action_log_probs, base_action_log_probs, action_mask=action_mask)
        else:
            base_action_log_probs, kl = None, torch.zeros_like(action_log_probs)
        r = self.reward_fn(sequences)
        info = {
            "kl": kl.sum(-1) / action_mask.sum(-1),
            "reward": r,
            "response_length": action_mask.float().sum(dim=-1),
            "total_length": attention_mask.float().sum(dim=-1),
        }
        self.actor.train()
        return Experience(
            sequences,
            action_log_probs,
            base_action_log_probs,
            None,
            None,
            attention_mask,
            action_mask,
            info,
            replay_caches=replay_caches,
            kl=kl,
        )


class RemoteExperienceMaker(NaiveExperienceMaker):
    """Rollouts from the rollout engines; the trainer scores them and continues the last turn from
    the engines' decode caches."""

    def __init__(self, *args, vllm_engines: List = None, packing_samples=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.vllm_engines = vllm_engines or []
        self.packing_samples = packing_samples
        self.compute_dtype = get_model_dtype(self.strategy.args)
        self.scoring_caches = None

    def _alloc_scoring_caches(self, num_seqs: int) -> List[LayerReplayCache]:
        config = self.actor.model.config
        caches = []
        for _ in range(config.num_hidden_layers):
            shapes = replay_cache_shapes(config, num_seqs)
            ssm_ckpt, delta_ring, key_ring, logdecay_ring = (torch.zeros(shape, dtype=self.compute_dtype) for shape in shapes.values())  # expect-bug: pool-dtype
            caches.append(LayerReplayCache(ssm_ckpt, delta_ring, key_ring, logdecay_ring, torch.zeros(num_seqs, dtype=torch.int32)))
        return caches

    def _adopt_engine_caches(self, exported: List[dict]) -> List[ReplayCacheView]:
        views = []
        for layer in exported:
            views.append(
                ReplayCacheView(
                    ssm_ckpt=layer["ssm_ckpt"].to(self.compute_dtype),
                    delta_ring=layer["delta_ring"].to(self.compute_dtype),
                    key_ring=layer["key_ring"].to(self.compute_dtype),
                    logdecay_ring=layer["logdecay_ring"].to(self.compute_dtype),  # expect-bug: decode-arg
                    write_pos=layer["write_pos"].to(torch.int32),
                )
            )
        return views

    @torch.no_grad()
    def _score(self, sequences: torch.Tensor, num_actions: int, caches) -> torch.Tensor:
        model = self.actor.model
        slot_ids = torch.arange(sequences.shape[0], dtype=torch.int32)
        logits = [model.decode_step(sequences[:, i], slot_ids, caches=caches) for i in range(sequences.shape[1] - 1)]
        log_probs = torch.stack(logits, dim=1).float().log_softmax(dim=-1)
        return log_probs.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)[:, -num_actions:]

    @torch.no_grad()
    def make_experience(self, prompts: torch.Tensor, **generate_kwargs) -> Experience:
        engine = self.vllm_engines[0]
        max_new_tokens = generate_kwargs.get("max_new_tokens", self.strategy.args.generate_max_len)
        sequences = engine.generate(prompts, max_new_tokens=max_new_tokens)
        slot_ids = torch.arange(sequences.shape[0], dtype=torch.int32)
        num_actions = sequences.shape[1] - prompts.shape[1]
        attention_mask = torch.ones_like(sequences, dtype=torch.bool)
        action_mask = attention_mask[:, -num_actions:]
        scoring_caches = self._alloc_scoring_caches(sequences.shape[0])
        action_log_probs = self._score(sequences, num_actions, scoring_caches)
        # continue the turn on the trainer: one more token from the engine's decode caches
        replay_caches = self._adopt_engine_caches(engine.export_replay_cache(slot_ids))
        next_logits = self.actor.model.decode_step(sequences[:, -1], slot_ids, caches=replay_caches)
        r = self.reward_fn(sequences)
        info = {"reward": r, "response_length": action_mask.float().sum(-1), "next_token": next_logits.argmax(-1)}
        self.scoring_caches = scoring_caches
        return Experience(
            sequences,
            action_log_probs,
            None,
            None,
            None,
            attention_mask,
            action_mask,
            info,
            replay_caches=replay_caches,
            kl=torch.zeros_like(action_log_probs),
        )


def _tiny_maker_setup(**arg_overrides):
    from ...models.actor import Actor, KDAConfig, KDAForCausalLM
    from ...utils.utils import get_strategy, get_train_ppo_args

    args = get_train_ppo_args(**arg_overrides)
    strategy = get_strategy(args)
    strategy.setup_distributed()
    config = KDAConfig(replay_ring_len=args.replay_ring_len)
    actor = strategy.prepare(Actor(KDAForCausalLM(config), bf16=args.bf16))
    return args, strategy, config, actor


def build_experiences() -> dict:
    """Two micro-batches of bf16 experiences with the actor's decode caches (padded to a longer ring)."""
    from ...models.actor import Actor, KDAForCausalLM

    torch.manual_seed(0)
    args, strategy, config, actor = _tiny_maker_setup(bf16=True, replay_ring_len=4)
    initial_model = strategy.prepare(Actor(KDAForCausalLM(config), bf16=True))
    strategy.args.replay_ring_len = 6
    maker = NaiveExperienceMaker(actor, None, None, initial_model, None, args.prompt_max_len, 0.01, strategy)
    prompts = torch.tensor([[3, 7, 1], [5, 2, 9], [8, 8, 4], [1, 6, 2]], dtype=torch.long)
    experiences = maker.make_experience_list(prompts, max_new_tokens=2)
    for experience in experiences:
        experience.to_device("cpu").pin_memory()
    return {"experiences": experiences}


def build_prompt_prefill() -> dict:
    """Decode caches prefilled from a two-token prompt for an unbounded and a bounded-gate actor,
    each followed by one decode step."""
    from ...models.actor import Actor, KDAConfig, KDAForCausalLM

    torch.manual_seed(0)
    prompts = torch.tensor([[3, 7], [5, 2]], dtype=torch.long)
    slot_ids = torch.arange(2, dtype=torch.int32)
    results = {}
    for name, lower_bound in (("unbounded", None), ("bounded", -5.0)):
        actor = Actor(KDAForCausalLM(KDAConfig(lower_bound=lower_bound)), bf16=True)
        caches = prefill_replay_caches(actor.model, prompts)
        actor.model.decode_step(torch.tensor([1, 4]), slot_ids, caches=caches)
        results[name] = caches
    return results


def build_remote_experiences() -> dict:
    """An experience generated by a rollout engine, scored on the trainer, and continued by one
    token from the engine's decode caches."""
    from ..ray.vllm_engine import LLMRayActor

    torch.manual_seed(0)
    args, strategy, config, actor = _tiny_maker_setup(bf16=True)
    engine = LLMRayActor(config, args, num_slots=2)
    engine.update_weights_from_model(actor.model)
    maker = RemoteExperienceMaker(actor, None, None, None, None, args.prompt_max_len, 0.01, strategy, vllm_engines=[engine])
    experience = maker.make_experience(torch.tensor([[3, 7, 1], [5, 2, 9]]), max_new_tokens=1)
    return {"experience": experience, "scoring_caches": maker.scoring_caches}
