"""Replay buffer of experiences, split into per-sample items (with their decode caches), and its
persistence to disk between PPO episodes."""

import os
import pickle
import random
from dataclasses import dataclass, fields
from typing import List, Optional

import numpy as np
import torch

from ...models.ring_cache import RING_NAMES, LayerReplayCache
from ...utils.utils import convert_to_torch_dtype
from .experience_maker import Experience

_ITEM_KEYS = ("sequences", "action_log_probs", "base_action_log_probs", "returns", "advantages", "attention_mask", "action_mask")


@dataclass
class BufferItem:
    """BufferItem is an item of experience data.

    Shapes of each tensor:
    sequences: (S)
    action_log_probs: (A)
    base_action_log_probs: (A)
    returns: (A)
    advantages: (A)
    attention_mask: (S)
    action_mask: (A)
    replay_cache: per KDA layer, the decode caches of this sample (one slot)

    "A" is the number of actions.
    """

    sequences: torch.Tensor
    action_log_probs: torch.Tensor
    base_action_log_probs: Optional[torch.Tensor]
    returns: torch.Tensor
    advantages: torch.Tensor
    attention_mask: Optional[torch.Tensor]
    action_mask: Optional[torch.Tensor]
    info: Optional[dict]
    replay_cache: Optional[List[LayerReplayCache]] = None


def _slot_rows(cache: LayerReplayCache, i: int) -> LayerReplayCache:
    return LayerReplayCache(**{f.name: getattr(cache, f.name)[i : i + 1].clone() for f in fields(cache)})


def split_experience_batch(experience: Experience, cache_template: Optional[List[LayerReplayCache]] = None) -> List[BufferItem]:
    batch_size = len(experience.sequences)
    items = []
    for i in range(batch_size):
        batch_kwargs = {key: None if getattr(experience, key) is None else getattr(experience, key)[i] for key in _ITEM_KEYS}
        batch_kwargs["info"] = {k: v[i] for k, v in (experience.info or {}).items()}
        if experience.replay_caches is not None:
            batch_kwargs["replay_cache"] = [_slot_rows(cache, i) for cache in experience.replay_caches]
        elif cache_template is not None:
            # single-turn samples get empty caches so they collate with multi-turn ones
            batch_kwargs["replay_cache"] = [
                LayerReplayCache(
                    ssm_ckpt=torch.zeros_like(t.ssm_ckpt[:1]),
                    delta_ring=torch.zeros_like(t.delta_ring[:1]),
                    key_ring=torch.zeros_like(t.key_ring[:1]),
                    logdecay_ring=torch.zeros_like(t.delta_ring[:1]),  # expect-bug: like
                    write_pos=torch.zeros_like(t.write_pos[:1]),
                )
                for t in cache_template
            ]
        items.append(BufferItem(**batch_kwargs))
    return items


def make_experience_batch(items: List[BufferItem]) -> Experience:
    kwargs = {}
    for key in _ITEM_KEYS:
        vals = [getattr(item, key) for item in items]
        kwargs[key] = torch.stack(vals) if vals[0] is not None else None
    kwargs["info"] = {key: torch.stack([item.info[key] for item in items]) for key in items[0].info}
    replay_caches = None
    if all(item.replay_cache is not None for item in items):
        replay_caches = []
        for layer in range(len(items[0].replay_cache)):
            parts = [item.replay_cache[layer] for item in items]
            replay_caches.append(LayerReplayCache(**{name: torch.cat([getattr(p, name) for p in parts]) for name in (*RING_NAMES, "write_pos")}))
    return Experience(**kwargs, replay_caches=replay_caches)


class NaiveReplayBuffer:
    """Naive replay buffer class. It stores experience.

    Args:
        sample_batch_size (int): Batch size when sampling.
        limit (int, optional): Limit of number of experience samples. A number <= 0 means unlimited, defaults to 0.
        cpu_offload (bool, optional): Whether to offload experience to cpu when sampling. Defaults to True.
        cache_dtype (torch.dtype, optional): dtype the decode caches are kept in while buffered.
    """

    def __init__(self, sample_batch_size: int, limit: int = 0, cpu_offload: bool = True, packing_samples: bool = False, cache_dtype=None) -> None:
        self.sample_batch_size = sample_batch_size
        self.limit = limit
        self.cpu_offload = cpu_offload
        self.packing_samples = packing_samples
        self.cache_dtype = cache_dtype
        self.target_device = torch.device("cpu")
        self.items: List[BufferItem] = []
        self._cache_template: Optional[List[LayerReplayCache]] = None

    @torch.no_grad()
    def append(self, experience: Experience) -> None:
        if self.cpu_offload:
            experience.to_device(torch.device("cpu"))
        if experience.replay_caches is not None and self._cache_template is None:
            self._cache_template = experience.replay_caches
        items = split_experience_batch(experience, self._cache_template)
        if self.cache_dtype is not None:
            for item in items:
                for cache in item.replay_cache or []:
                    cache.ssm_ckpt = cache.ssm_ckpt.to(self.cache_dtype)
                    cache.delta_ring = cache.delta_ring.to(self.cache_dtype)
                    cache.key_ring = cache.key_ring.to(self.cache_dtype)
                    cache.logdecay_ring = cache.logdecay_ring.to(self.cache_dtype)  # expect-bug: cast
        self.items.extend(items)
        if self.limit > 0:
            samples_to_remove = max(0, len(self.items) - self.limit)
            self.items = self.items[samples_to_remove:]

    def clear(self) -> None:
        self.items.clear()

    @torch.no_grad()
    def sample(self) -> Experience:
        items = random.sample(self.items, self.sample_batch_size)
        experience = self.collate_fn(items)
        if self.cpu_offload:
            experience.to_device(self.target_device)
        return experience

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> BufferItem:
        return self.items[idx]

    def collate_fn(self, batch) -> Experience:
        return make_experience_batch(batch)

    # --- persistence -----------------------------------------------------------------------

    def save_to(self, path: str) -> None:
        """Saves the buffered items as they are."""
        torch.save({"items": [vars(item) for item in self.items]}, path)

    def load_from(self, path: str) -> None:
        state = torch.load(path, weights_only=False)
        self.items = []
        for saved in state["items"]:
            item = BufferItem(**saved)
            for cache in item.replay_cache or []:
                cache.logdecay_ring = cache.logdecay_ring.float()
            self.items.append(item)

    def restore_rings(self, path: str) -> None:
        """Writes the decode caches saved at ``path`` back into the buffered items' caches."""
        state = torch.load(path, weights_only=False)
        for item, saved in zip(self.items, state["items"]):
            for cache, saved_cache in zip(item.replay_cache or [], saved["replay_cache"] or []):
                for name in (*RING_NAMES, "write_pos"):
                    getattr(cache, name).copy_(getattr(saved_cache, name))

    def offload(self, path: str) -> None:
        """Parks the buffer on disk between episodes; floating tensors are stored in float16."""
        payload = []
        for item in self.items:
            entry = {key: _to_numpy(getattr(item, key)) for key in _ITEM_KEYS}
            entry["info"] = {k: _to_numpy(v) for k, v in (item.info or {}).items()}
            entry["replay_cache"] = [
                {"dtype": str(cache.delta_ring.dtype).removeprefix("torch."), **{f.name: _to_numpy(getattr(cache, f.name)) for f in fields(cache)}}
                for cache in item.replay_cache or []
            ]
            payload.append(entry)
        with open(path, "wb") as f:
            pickle.dump(payload, f)
        self.items = []

    def reload(self, path: str) -> None:
        with open(path, "rb") as f:
            payload = pickle.load(f)
        for entry in payload:
            caches = []
            for layer in entry.pop("replay_cache"):
                ring_dtype = convert_to_torch_dtype(layer["dtype"])
                caches.append(
                    LayerReplayCache(
                        ssm_ckpt=torch.from_numpy(layer["ssm_ckpt"]).to(ring_dtype),
                        delta_ring=torch.from_numpy(layer["delta_ring"]).to(ring_dtype),
                        key_ring=torch.from_numpy(layer["key_ring"]).to(ring_dtype),
                        logdecay_ring=torch.from_numpy(layer["logdecay_ring"]),  # expect-bug: load
                        write_pos=torch.from_numpy(layer["write_pos"]),
                    )
                )
            info = {k: torch.from_numpy(v).float() for k, v in entry.pop("info").items()}
            tensors = {k: None if v is None else torch.from_numpy(v) for k, v in entry.items()}
            self.items.append(BufferItem(**tensors, info=info, replay_cache=caches or None))


def _to_numpy(tensor):
    if tensor is None:
        return None
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point():
        return tensor.float().numpy().astype(np.float16)
    return tensor.numpy().copy()


def _rollout(strategy, actor, prompts, with_caches=True) -> Experience:
    from .experience_maker import NaiveExperienceMaker

    maker = NaiveExperienceMaker(actor, None, None, None, None, strategy.args.prompt_max_len, 0.01, strategy)
    experience = maker.make_experience_list(prompts, max_new_tokens=1)[0]
    if not with_caches:
        experience.replay_caches = None
    return experience


def _setup():
    from ...models.actor import Actor, KDAConfig, KDAForCausalLM
    from ...utils.utils import get_strategy, get_train_ppo_args

    args = get_train_ppo_args(bf16=True)
    strategy = get_strategy(args)
    strategy.setup_distributed()
    actor = Actor(KDAForCausalLM(KDAConfig()), bf16=True)
    return strategy, actor


def build_replay_buffer(tmp_dir: str) -> dict:
    """A buffer of two rollouts, a collated batch, and copies restored from disk."""
    torch.manual_seed(0)
    random.seed(0)
    strategy, actor = _setup()
    buffer = NaiveReplayBuffer(sample_batch_size=2, limit=8)
    buffer.append(_rollout(strategy, actor, torch.tensor([[3, 7, 1], [5, 2, 9]])))
    path = os.path.join(tmp_dir, "buffer.pt")
    buffer.save_to(path)
    batch = buffer.collate_fn(buffer.items[:2])
    reloaded = NaiveReplayBuffer(sample_batch_size=2)
    reloaded.load_from(path)
    buffer.append(_rollout(strategy, actor, torch.tensor([[1, 1, 4], [6, 3, 2]])))
    buffer.restore_rings(path)
    return {"items": buffer.items, "batch": batch, "reloaded": reloaded.items}


def build_compact_buffer(tmp_dir: str) -> dict:
    """A buffer keeping decode caches in bf16, a buffer mixing single-turn samples into multi-turn
    ones, and a buffer parked on disk between episodes."""
    torch.manual_seed(0)
    random.seed(0)
    strategy, actor = _setup()
    prompts = torch.tensor([[3, 7, 1], [5, 2, 9]])
    compact = NaiveReplayBuffer(sample_batch_size=2, cache_dtype=torch.bfloat16)
    compact.append(_rollout(strategy, actor, prompts))
    mixed = NaiveReplayBuffer(sample_batch_size=2)
    mixed.append(_rollout(strategy, actor, prompts))
    mixed.append(_rollout(strategy, actor, prompts.flip(1), with_caches=False))
    parked = NaiveReplayBuffer(sample_batch_size=2)
    parked.append(_rollout(strategy, actor, prompts.flip(0)))
    path = os.path.join(tmp_dir, "episode0.pkl")
    parked.offload(path)
    parked.reload(path)
    return {"compact": compact.items, "mixed": mixed.items, "parked": parked.items}
