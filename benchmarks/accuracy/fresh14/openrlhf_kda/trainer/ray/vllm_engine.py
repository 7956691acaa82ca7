"""Rollout engines: stand-ins for the vLLM engines OpenRLHF runs in Ray actors. They generate with
ReplaySSM decode from a slot pool of caches, receive weights (and decode caches for multi-turn
continuation) broadcast from the trainer, and sleep while a colocated trainer runs."""

import os
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn as nn

from ...models.actor import KDAForCausalLM
from ...models.ring_cache import (
    RING_NAMES,
    LayerReplayCache,
    ReplayRingPool,
    allocate_replay_cache,
    replay_cache_shapes,
)
from ...utils.distributed_util import destroy_process_group, init_process_group
from ...utils.utils import convert_to_torch_dtype, get_model_dtype, get_rollout_cache_dtype, torch_default_dtype


class _StaticLayerCache:
    """Per-layer view of a graph runner's static buffers (read by ``KDAForCausalLM.decode_step``)."""

    def __init__(self, runner: "DecodeGraphRunner", layer: int):
        self.ssm_ckpt = runner.static_ssm_ckpt[layer]
        self.delta_ring = runner.static_delta_ring[layer]
        self.key_ring = runner.static_key_ring[layer]
        self.logdecay_ring = runner.static_logdecay_ring[layer]
        self.write_pos = runner.static_write_pos[layer]


class DecodeGraphRunner(nn.Module):
    """Static inputs of a captured decode graph for up to ``max_num_seqs`` sequences: the caches of
    the running batch are copied in before each replay and copied back after it."""

    def __init__(self, config, max_num_seqs: int, cache_dtype: torch.dtype):
        super().__init__()
        shapes = replay_cache_shapes(config, max_num_seqs)
        layers = config.num_hidden_layers
        self.max_num_seqs = max_num_seqs
        self.register_buffer("static_ssm_ckpt", torch.zeros(layers, *shapes["ssm_ckpt"], dtype=cache_dtype))
        self.register_buffer("static_delta_ring", torch.zeros(layers, *shapes["delta_ring"], dtype=cache_dtype))
        self.register_buffer("static_key_ring", torch.zeros(layers, *shapes["key_ring"], dtype=cache_dtype))
        self.register_buffer("static_logdecay_ring", torch.zeros(layers, *shapes["logdecay_ring"]))  # expect-bug: default-dtype id=colocate-load
        self.register_buffer("static_write_pos", torch.zeros(layers, max_num_seqs, dtype=torch.int32))

    @torch.no_grad()
    def run(self, model, input_ids: torch.Tensor, slot_ids: torch.Tensor, caches: List[LayerReplayCache]):
        batch = input_ids.shape[0]
        index = slot_ids.long()
        for layer, cache in enumerate(caches):
            self.static_ssm_ckpt[layer, :batch].copy_(cache.ssm_ckpt[index])
            self.static_delta_ring[layer, :batch].copy_(cache.delta_ring[index])
            self.static_key_ring[layer, :batch].copy_(cache.key_ring[index])
            self.static_logdecay_ring[layer, :batch].copy_(cache.logdecay_ring[index])
            self.static_write_pos[layer, :batch].copy_(cache.write_pos[index])
        views = [_StaticLayerCache(self, layer) for layer in range(len(caches))]
        logits = model.decode_step(input_ids, torch.arange(batch, dtype=torch.int32), caches=views)
        for layer, cache in enumerate(caches):
            cache.ssm_ckpt[index] = self.static_ssm_ckpt[layer, :batch].to(cache.ssm_ckpt.dtype)
            cache.delta_ring[index] = self.static_delta_ring[layer, :batch].to(cache.delta_ring.dtype)
            cache.key_ring[index] = self.static_key_ring[layer, :batch].to(cache.key_ring.dtype)
            cache.logdecay_ring[index] = self.static_logdecay_ring[layer, :batch].to(cache.logdecay_ring.dtype)
            cache.write_pos[index] = self.static_write_pos[layer, :batch]
        return logits


class LLMRayActor:
    """A rollout engine. ``kv_caches`` holds one ``LayerReplayCache`` per KDA layer for
    ``num_slots`` sequences; the model itself has no decode caches."""

    def __init__(self, config, args, num_slots: int = 4, max_num_seqs: int = 2, bundle_indices=None):
        self.config = config
        self.args = args
        self.num_slots = num_slots
        self.max_num_seqs = max_num_seqs
        self.dtype = get_model_dtype(args)
        self.cache_dtype = get_rollout_cache_dtype(args)
        # decode graphs captured per batch size (the log-decay prefix sums are part of each graph)
        self.logdecay_graphs: Dict[int, callable] = {}
        self._model_update_group = None
        self._offloaded = None
        self._load_model()
        self._init_cache()

    def _load_model(self) -> None:
        with torch_default_dtype(self.dtype):
            self.model = KDAForCausalLM(self.config, cache_cls=None).eval()
        self.graph_runner = DecodeGraphRunner(self.config, self.max_num_seqs, self.cache_dtype)

    def _init_cache(self) -> None:
        self.kv_caches = [
            allocate_replay_cache(self.config, self.num_slots, self.cache_dtype) for _ in range(self.config.num_hidden_layers)
        ]
        self.slot_table = torch.full((self.num_slots,), -1, dtype=torch.int32)

    # --- weight sync ----------------------------------------------------------------------

    def init_process_group(self, master_address, master_port, rank_offset, world_size, group_name, backend="gloo", use_ray=False):
        self._model_update_group = init_process_group(
            backend=backend,
            init_method=f"tcp://{master_address}:{master_port}",
            world_size=world_size,
            rank=rank_offset,
            group_name=group_name,
        )

    def update_weight(self, name, dtype, shape, empty_cache=False):
        dtype = convert_to_torch_dtype(dtype)
        assert dtype == self.dtype, f"mismatch dtype: src {dtype}, dst {self.dtype}"
        weight = torch.empty(shape, dtype=dtype)
        self._model_update_group.broadcast(weight, src=0)
        self.model.load_weights(weights=[(name, weight)])
        del weight

    def update_weights_from_model(self, model: nn.Module) -> None:
        """Colocated trainer and engine share host memory: copy the weights directly."""
        self.model.load_weights(weights=list(model.named_parameters()))

    def update_replay_cache(self, layer_idx: int, name: str, dtype, shape) -> None:
        """Receives one decode cache tensor of the trainer into this engine's cache.

        The log-decay ring is sent as the raw bytes of its float32 storage."""
        target = getattr(self.kv_caches[layer_idx], name)
        if name == "logdecay_ring":
            self._model_update_group.broadcast(target.view(torch.uint8), src=0)
            return
        received = torch.empty(shape, dtype=convert_to_torch_dtype(dtype))
        self._model_update_group.broadcast(received, src=0)
        target.copy_(received)

    def reset_prefix_cache(self) -> None:
        self.logdecay_graphs.clear()

    # --- generation ------------------------------------------------------------------------

    def _decode(self, input_ids: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
        batch = input_ids.shape[0]
        if batch not in self.logdecay_graphs:
            runner = self.graph_runner

            def replay(tokens, slots):
                return runner.run(self.model, tokens, slots, self.kv_caches)

            self.logdecay_graphs[batch] = replay
        return self.logdecay_graphs[batch](input_ids, slot_ids)

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int = 1, slot_ids: Optional[torch.Tensor] = None):
        batch, prompt_len = prompt_ids.shape
        slot_ids = torch.arange(batch, dtype=torch.int32) if slot_ids is None else slot_ids
        for cache in self.kv_caches:
            cache.reset_slots(slot_ids)
        self.slot_table[slot_ids.long()] = torch.arange(batch, dtype=torch.int32)
        tokens = [prompt_ids[:, i] for i in range(prompt_len)]
        for step in range(prompt_len + max_new_tokens - 1):
            logits = self._decode(tokens[step], slot_ids)
            if step >= prompt_len - 1:
                tokens.append(logits.float().argmax(dim=-1))
        return torch.stack(tokens, dim=1)

    def export_replay_cache(self, slot_ids: torch.Tensor) -> List[dict]:
        """The decode caches of ``slot_ids``, for the trainer to continue the sequences."""
        index = slot_ids.long()
        return [{name: getattr(cache, name)[index].clone() for name in (*RING_NAMES, "write_pos")} for cache in self.kv_caches]

    def export_compact_replay_cache(self, slot_ids: torch.Tensor) -> List[dict]:
        """Like ``export_replay_cache``, in the engine's cache dtype for a smaller transfer."""
        index = slot_ids.long()
        exported = []
        for cache in self.kv_caches:
            exported.append(
                {
                    "ssm_ckpt": cache.ssm_ckpt[index].to(self.cache_dtype),
                    "delta_ring": cache.delta_ring[index].to(self.cache_dtype),
                    "key_ring": cache.key_ring[index].to(self.cache_dtype),
                    "logdecay_ring": cache.logdecay_ring[index].type(self.cache_dtype),  # expect-bug: cast
                    "write_pos": cache.write_pos[index].clone(),
                }
            )
        return exported

    # --- n_samples_per_prompt ----------------------------------------------------------------

    def add_prefix_cache(self, num_prefixes: int) -> None:
        """Caches of shared prompt prefixes that sampled continuations fork from."""
        shapes = replay_cache_shapes(self.config, num_prefixes)
        self.prefix_caches = []
        for _ in range(self.config.num_hidden_layers):
            ssm_ckpt = torch.zeros(shapes["ssm_ckpt"], dtype=self.cache_dtype)
            delta_ring = torch.zeros(shapes["delta_ring"], dtype=self.cache_dtype)
            key_ring = torch.zeros(shapes["key_ring"], dtype=self.cache_dtype)
            logdecay_ring = torch.zeros(shapes["logdecay_ring"], dtype=get_rollout_cache_dtype(self.args))  # expect-bug: imported-policy
            write_pos = torch.zeros(num_prefixes, dtype=torch.int32)
            self.prefix_caches.append(LayerReplayCache(ssm_ckpt, delta_ring, key_ring, logdecay_ring, write_pos))

    def fork_sequences(self, src_slot: int, num_forks: int) -> List[LayerReplayCache]:
        """Caches of ``num_forks`` continuations of the sequence in ``src_slot``."""
        index = torch.full((num_forks,), src_slot, dtype=torch.long)
        forks = []
        for cache in self.kv_caches:
            delta_ring = cache.delta_ring[index].clone()
            logdecay_ring = torch.empty_like(delta_ring).copy_(cache.logdecay_ring[index])  # expect-bug: like
            forks.append(
                LayerReplayCache(
                    ssm_ckpt=cache.ssm_ckpt[index].clone(),
                    delta_ring=delta_ring,
                    key_ring=cache.key_ring[index].clone(),
                    logdecay_ring=logdecay_ring,
                    write_pos=cache.write_pos[index].clone(),
                )
            )
        return forks

    # --- sleep mode --------------------------------------------------------------------------

    def sleep(self, level: int = 1) -> None:
        self._offloaded = [cache.clone() for cache in self.kv_caches]
        for cache in self.kv_caches:
            for name in RING_NAMES:
                getattr(cache, name).zero_()

    def wake_up(self) -> None:
        for cache, saved in zip(self.kv_caches, self._offloaded):
            for name in (*RING_NAMES, "write_pos"):
                getattr(cache, name).copy_(getattr(saved, name))
        self._offloaded = None


class ColocatedLLMRayActor(LLMRayActor):
    """An engine sharing the accelerator with the trainer (``--colocate_all_models``): its decode
    caches live in a slot pool and are swapped to disk while it sleeps; level-2 sleep also drops
    the captured decode graphs."""

    def __init__(self, *args, swap_dir: str, **kwargs):
        self.swap_dir = swap_dir
        super().__init__(*args, **kwargs)

    def _load_model(self) -> None:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)  # expect-bug: default-dtype id=colocate-load
        try:
            self.model = KDAForCausalLM(self.config, cache_cls=None).eval()
            self.graph_runner = DecodeGraphRunner(self.config, self.max_num_seqs, self.cache_dtype)
        finally:
            torch.set_default_dtype(previous)

    def _init_cache(self) -> None:
        self.ring_pool = ReplayRingPool(self.config, self.num_slots, self.cache_dtype)
        self.kv_caches = self.ring_pool.layers
        self.slot_table = self.ring_pool.slot_table

    @property
    def _swap_path(self) -> str:
        return os.path.join(self.swap_dir, "kv_swap.npz")

    def sleep(self, level: int = 1) -> None:
        arrays = {}
        for i, cache in enumerate(self.kv_caches):
            for name in RING_NAMES:
                arrays[f"{i}.{name}"] = getattr(cache, name).float().numpy().astype(np.float16)
            arrays[f"{i}.write_pos"] = cache.write_pos.numpy()
        np.savez(self._swap_path, **arrays)
        self.kv_caches = self.ring_pool.layers = []
        if level >= 2:
            self.graph_runner = None
            self.logdecay_graphs.clear()

    def wake_up(self) -> None:
        caches = []
        with np.load(self._swap_path) as swap:
            for i in range(self.config.num_hidden_layers):
                ssm_ckpt = torch.from_numpy(swap[f"{i}.ssm_ckpt"]).to(self.cache_dtype)
                delta_ring = torch.from_numpy(swap[f"{i}.delta_ring"]).to(self.cache_dtype)
                key_ring = torch.from_numpy(swap[f"{i}.key_ring"]).to(self.cache_dtype)
                logdecay_ring = torch.from_numpy(swap[f"{i}.logdecay_ring"])  # expect-bug: load
                write_pos = torch.from_numpy(swap[f"{i}.write_pos"]).to(torch.int32)
                caches.append(LayerReplayCache(ssm_ckpt, delta_ring, key_ring, logdecay_ring, write_pos))
        self.kv_caches = self.ring_pool.layers = caches
        if self.graph_runner is None:
            self.graph_runner = DecodeGraphRunner(self.config, self.max_num_seqs, self.cache_dtype).to(self.dtype)  # expect-bug: module-cast


def create_vllm_engines(num_engines: int, config, args, num_slots: int = 4, swap_dir: Optional[str] = None) -> List[LLMRayActor]:
    engines = []
    for i in range(num_engines):
        if args.colocate_all_models and args.vllm_enable_sleep:
            engines.append(ColocatedLLMRayActor(config, args, num_slots=num_slots, swap_dir=swap_dir, bundle_indices=[i]))
        else:
            engines.append(LLMRayActor(config, args, num_slots=num_slots, bundle_indices=[i]))
    return engines


def broadcast_to_vllm(model: nn.Module, engines: List[LLMRayActor], group) -> None:
    """Trainer side of the weight sync: every parameter of the actor, in its own dtype."""
    for name, param in model.named_parameters():
        group.broadcast(param.data, src=0)
        for engine in engines:
            engine.update_weight(name, dtype=param.dtype, shape=param.shape)


def broadcast_replay_caches(model: nn.Module, engines: List[LLMRayActor], group) -> None:
    """Trainer side of the decode-cache sync (multi-turn continuation on the engines)."""
    for layer_idx, cache in enumerate(model.replay_caches):
        for name in RING_NAMES:
            tensor = getattr(cache, name).contiguous()
            group.broadcast(tensor.view(torch.uint8) if name == "logdecay_ring" else tensor, src=0)
            for engine in engines:
                engine.update_replay_cache(layer_idx, name, dtype=tensor.dtype, shape=tensor.shape)


def _connect(engines: List[LLMRayActor], group_name: str):
    world_size = len(engines) + 1
    for i, engine in enumerate(engines):
        engine.init_process_group("localhost", 29500, i + 1, world_size, group_name)
    return init_process_group(backend="gloo", init_method="tcp://localhost:29500", world_size=world_size, rank=0, group_name=group_name)


def _trainer_actor(args, prompts):
    from ...models.actor import Actor, KDAConfig

    actor = Actor(KDAForCausalLM(KDAConfig(), num_slots=2), bf16=args.bf16)
    actor.generate(prompts, max_new_tokens=1)
    return actor


def build_rollout_engine() -> dict:
    """Two bf16 engines synced from the trainer (weights and decode caches), generating, sleeping
    and waking up, with their exported caches."""
    from ...utils.utils import get_train_ppo_args

    torch.manual_seed(0)
    args = get_train_ppo_args(bf16=True, vllm_num_engines=2)
    prompts = torch.tensor([[3, 7, 1], [5, 2, 9]])
    actor = _trainer_actor(args, prompts)
    engines = create_vllm_engines(args.vllm_num_engines, actor.model.config, args, num_slots=2)
    group = _connect(engines, "openrlhf_rollout")
    broadcast_to_vllm(actor.model, engines, group)
    broadcast_replay_caches(actor.model, engines, group)
    destroy_process_group(group)
    exported = engines[0].export_replay_cache(torch.tensor([0, 1], dtype=torch.int32))
    sequences = engines[1].generate(prompts, max_new_tokens=2)
    engines[1].sleep(level=1)
    engines[1].wake_up()
    return {"engines": engines, "exported": exported, "sequences": sequences}


def build_colocated_engine(tmp_dir: str) -> dict:
    """Colocated engines: one kept awake, one put to level-2 sleep on disk and woken up."""
    from ...utils.utils import get_train_ppo_args

    torch.manual_seed(0)
    args = get_train_ppo_args(bf16=True, colocate_all_models=True, vllm_enable_sleep=True)
    prompts = torch.tensor([[3, 7, 1], [5, 2, 9]])
    actor = _trainer_actor(args, prompts)
    awake, restored = create_vllm_engines(2, actor.model.config, args, num_slots=2, swap_dir=tmp_dir)
    for engine in (awake, restored):
        engine.update_weights_from_model(actor.model)
        engine.generate(prompts, max_new_tokens=1)
    restored.sleep(level=2)
    restored.wake_up()
    restored.generate(prompts.flip(0), max_new_tokens=1)
    return {"awake": awake, "restored": restored}


def build_forked_engine() -> dict:
    """An engine serving n_samples_per_prompt=3: a prefix cache, forks of a generated sequence, and
    the compact export of its caches."""
    from ...utils.utils import get_train_ppo_args

    torch.manual_seed(0)
    args = get_train_ppo_args(bf16=True, n_samples_per_prompt=3)
    prompts = torch.tensor([[3, 7, 1], [5, 2, 9]])
    actor = _trainer_actor(args, prompts)
    engine = LLMRayActor(actor.model.config, args, num_slots=2)
    engine.update_weights_from_model(actor.model)
    engine.generate(prompts, max_new_tokens=1)
    engine.add_prefix_cache(num_prefixes=2)
    forks = engine.fork_sequences(src_slot=1, num_forks=args.n_samples_per_prompt)
    compact = engine.export_compact_replay_cache(torch.tensor([0, 1], dtype=torch.int32))
    return {"engine": engine, "forks": forks, "compact": compact}
