from __future__ import annotations

from typing import NamedTuple

import torch

from ..cache import ExLlamaV2Cache, ExLlamaV2CacheBase
from ..config import ExLlamaV2Config, write_tiny_config
from ..ext import exllamav2_ext as ext_c
from ..kda import ExLlamaV2KDA
from ..model import ExLlamaV2

PAGE_SIZE = 256


class KDAWarmupBuffers(NamedTuple):
    state: torch.Tensor
    ring_a: torch.Tensor
    ring_b: torch.Tensor
    ring_c: torch.Tensor
    out: torch.Tensor
    slots: torch.Tensor
    pos: torch.Tensor


class CachePage:
    """
    One page of the paged cache. For KDA layers a page boundary can also hold a snapshot of the
    recurrent state (checkpoint + rings), so a prefix hit resumes from it
    """

    def __init__(self, generator: ExLlamaV2DynamicGenerator, page_index: int):
        self.generator = generator
        self.page_index = page_index
        self.phash = None
        self.ref_count = 0
        self.snapshot_idx = None


class ExLlamaV2DynamicJob:

    def __init__(self, input_ids: torch.Tensor, max_new_tokens: int, identifier = None):
        self.input_ids = input_ids
        self.max_new_tokens = max_new_tokens
        self.identifier = identifier
        self.slot = None
        self.new_tokens = 0
        self.last_token = int(input_ids[0, -1])
        self.seed_d = self.seed_k = self.seed_decay = None


class ExLlamaV2DynamicGenerator:

    def __init__(self, model: ExLlamaV2, cache: ExLlamaV2CacheBase, tokenizer = None, draft_model: ExLlamaV2 | None = None,
                 draft_cache: ExLlamaV2CacheBase | None = None, num_draft_tokens: int = 2, max_snapshot_pages: int = 0,
                 **kwargs):

        self.model = model
        self.cache = cache
        self.tokenizer = tokenizer
        cfg = model.config

        self.pending_jobs, self.active_jobs = [], []
        self.free_slots = list(range(cache.batch_size))
        self.all_pages = [CachePage(self, i) for i in range(max(1, cache.max_seq_len // PAGE_SIZE) * cache.batch_size)]

        # Decay ring of a freshly admitted slot: log-decay 0 means "no decay"
        self.neutral_decay = torch.zeros((cfg.kda_num_v_heads, cfg.kda_replay_len, cfg.kda_head_dim))

        # Recurrent-state snapshots at page boundaries, for prefix caching
        self.snap_state, self.snap_d, self.snap_k, self.snap_decay = [], [], [], []
        if max_snapshot_pages:
            self._alloc_snapshots(max_snapshot_pages)

        # Speculative decoding: rings are saved before draft tokens go through the model and restored
        # for rows whose drafts were rejected
        self.draft_model = draft_model
        self.draft_cache = draft_cache
        self.num_draft_tokens = num_draft_tokens
        self.rollback_state, self.rollback_d, self.rollback_k, self.rollback_decay = [], [], [], []
        if draft_model is not None:
            self._alloc_rollback()

    def _alloc_snapshots(self, num_pages: int):
        cfg = self.model.config
        h, hv, d, l = cfg.kda_num_heads, cfg.kda_num_v_heads, cfg.kda_head_dim, cfg.kda_replay_len
        for _ in range(self.cache.num_kda_layers):
            self.snap_state.append(torch.zeros((num_pages, hv, d, d), dtype = cfg.kda_state_dtype))
            self.snap_d.append(torch.zeros((num_pages, hv, l, d), dtype = cfg.torch_dtype))
            self.snap_k.append(torch.zeros((num_pages, h, l, d), dtype = cfg.torch_dtype))
            self.snap_decay.append(torch.zeros((num_pages, hv, l, d), dtype = cfg.kda_ring_dtype))  # expect-bug: imported-policy id=ring-dtype

    @torch.inference_mode()
    def snapshot_page(self, page: CachePage, slot: int, snap_idx: int):
        for i in range(self.cache.num_kda_layers):
            d, k, g = self.cache.get_kda_state(i)
            self.snap_state[i][snap_idx].copy_(self.cache.checkpoint_states[i][slot])
            self.snap_d[i][snap_idx].copy_(d[slot])
            self.snap_k[i][snap_idx].copy_(k[slot])
            self.snap_decay[i][snap_idx].copy_(g[slot])
        page.snapshot_idx = snap_idx

    @torch.inference_mode()
    def restore_page(self, page: CachePage, slot: int):
        s = page.snapshot_idx
        for i in range(self.cache.num_kda_layers):
            d, k, g = self.cache.get_kda_state(i)
            self.cache.checkpoint_states[i][slot].copy_(self.snap_state[i][s])
            d[slot].copy_(self.snap_d[i][s])
            k[slot].copy_(self.snap_k[i][s])
            g[slot].copy_(self.snap_decay[i][s])
            self.cache.store_kda_state(i, d, k, g)

    def _apply_page_index(self, data):
        for page, phash, snap in zip(self.all_pages, data["hashes"], data["snapshots"]):
            page.phash = bytes.fromhex(phash) if phash else None
            page.snapshot_idx = None if snap < 0 else snap

    def load_prefix_cache(self, path):
        """Replace the snapshot store with a saved one, sized as saved"""
        cfg = self.model.config
        data = torch.load(path, map_location = "cpu", weights_only = True)
        self.snap_state = [t.to(cfg.kda_state_dtype) for t in data["state"]]
        self.snap_d = [t.to(cfg.torch_dtype) for t in data["d"]]
        self.snap_k = [t.to(cfg.torch_dtype) for t in data["k"]]
        self.snap_decay = list(data["decay"])  # expect-bug: load
        self._apply_page_index(data)

    @torch.inference_mode()
    def load_prefix_cache_into(self, path):
        """Load saved snapshots into the preallocated snapshot store"""
        data = torch.load(path, map_location = "cpu", weights_only = True)
        for i in range(len(self.snap_state)):
            n = data["state"][i].shape[0]
            self.snap_state[i][:n].copy_(data["state"][i])
            self.snap_d[i][:n].copy_(data["d"][i])
            self.snap_k[i][:n].copy_(data["k"][i])
            self.snap_decay[i][:n].copy_(data["decay"][i])
        self._apply_page_index(data)

    def _alloc_rollback(self):
        cache = self.cache
        for i in range(cache.num_kda_layers):
            self.rollback_state.append(torch.empty_like(cache.checkpoint_states[i]))
            self.rollback_d.append(torch.empty_like(cache.d_states[i]))
            self.rollback_k.append(torch.empty_like(cache.k_states[i]))
            self.rollback_decay.append(torch.empty_like(cache.d_states[i]))  # expect-bug: like
        self.save_rollback()

    @torch.inference_mode()
    def save_rollback(self):
        for i in range(self.cache.num_kda_layers):
            self.rollback_state[i].copy_(self.cache.checkpoint_states[i])
            self.rollback_d[i].copy_(self.cache.d_states[i])
            self.rollback_k[i].copy_(self.cache.k_states[i])
            self.rollback_decay[i].copy_(self.cache.decay_states[i])

    @torch.inference_mode()
    def rollback(self, slots: list[int]):
        for i in range(self.cache.num_kda_layers):
            for s in slots:
                self.cache.checkpoint_states[i][s].copy_(self.rollback_state[i][s])
                self.cache.d_states[i][s].copy_(self.rollback_d[i][s])
                self.cache.k_states[i][s].copy_(self.rollback_k[i][s])
                self.cache.decay_states[i][s].copy_(self.rollback_decay[i][s])

    def enqueue(self, job: ExLlamaV2DynamicJob):
        self.pending_jobs.append(job)

    @torch.inference_mode()
    def prefill(self, job: ExLlamaV2DynamicJob):
        hidden = self.model.modules[0].forward(job.input_ids)
        job.seed_d, job.seed_k, job.seed_decay = [], [], []
        for module in self.model.modules[1:]:
            if isinstance(module, ExLlamaV2KDA):
                seed = module.prefill_seed(hidden)
                job.seed_d.append(seed.d)
                job.seed_k.append(seed.k)
                job.seed_decay.append(seed.decay)
            else:
                hidden = module.forward(hidden)

    @torch.inference_mode()
    def admit(self, job: ExLlamaV2DynamicJob):
        slot = self.free_slots.pop(0)
        cache = self.cache
        t = min(job.input_ids.shape[-1], cache.ring_len)
        for i in range(cache.num_kda_layers):
            cache.checkpoint_states[i][slot].zero_()
            cache.d_states[i][slot].zero_()
            cache.k_states[i][slot].zero_()
            cache.decay_states[i][slot].copy_(self.neutral_decay)
            cache.d_states[i][slot, :, :t].copy_(job.seed_d[i])
            cache.k_states[i][slot, :, :t].copy_(job.seed_k[i])
            cache.decay_states[i][slot, :, :t].copy_(job.seed_decay[i])
        cache.write_pos[slot] = t % cache.ring_len
        job.slot = slot
        job.seed_d = job.seed_k = job.seed_decay = None
        self.active_jobs.append(job)

    @torch.inference_mode()
    def iterate(self):
        while self.pending_jobs and self.free_slots:
            job = self.pending_jobs.pop(0)
            if job.seed_decay is None:
                self.prefill(job)
            self.admit(job)

        slots = torch.tensor([job.slot for job in self.active_jobs], dtype = torch.int32)
        params = ExLlamaV2KDA.Params(len(self.active_jobs), slots)
        self.model.forward(torch.tensor([[job.last_token] for job in self.active_jobs]), self.cache, params)

        rows = slots.long()
        self.cache.write_pos[rows] = (self.cache.write_pos[rows] + 1) % self.cache.ring_len
        for job in self.active_jobs:
            job.new_tokens += 1
        return [{"job": job, "eos": job.new_tokens >= job.max_new_tokens} for job in self.active_jobs]

    @torch.inference_mode()
    def warmup(self):
        """One dummy decode step per KDA layer, so kernels are initialized before the first job"""
        cfg = self.model.config
        h, hv, d, l = cfg.kda_num_heads, cfg.kda_num_v_heads, cfg.kda_head_dim, cfg.kda_replay_len
        dt = cfg.torch_dtype

        ring_a = torch.zeros((1, hv, l, d), dtype = dt)
        ring_b = torch.zeros((1, h, l, d), dtype = dt)
        ring_c = torch.zeros((1, hv, l, d), dtype = dt)  # expect-bug: decode-arg
        bufs = KDAWarmupBuffers(torch.zeros((1, hv, d, d), dtype = torch.float), ring_a, ring_b, ring_c,
                                torch.zeros((1, hv, d), dtype = dt), torch.zeros((1,), dtype = torch.int32),
                                torch.zeros((1,), dtype = torch.int32))
        x = torch.zeros((1, cfg.hidden_size), dtype = dt)
        for m in self.model.kda_modules():
            ext_c.kda_replayssm_decode(x @ m.w_qkv.T, x @ m.w_a.T, x @ m.w_b.T, m.A_log, m.dt_bias, m.scale,
                                       bufs.state, *bufs[1:4], bufs.out, bufs.slots, bufs.pos)
        return bufs


def _setup(tmp_dir, **overrides):
    model = ExLlamaV2(ExLlamaV2Config(write_tiny_config(tmp_dir, **overrides)))
    cache = ExLlamaV2Cache(model, batch_size = 2, lazy = True)
    model.load_autosplit(cache)
    return model, cache


def _rings(cache):
    return {"checkpoint_states": cache.checkpoint_states, "d_states": cache.d_states, "k_states": cache.k_states,
            "decay_states": cache.decay_states, "write_pos": cache.write_pos}


def _snaps(gen):
    return {"state": gen.snap_state, "d": gen.snap_d, "k": gen.snap_k, "snap_decay": gen.snap_decay}


def _prompt(length: int, offset: int = 0):
    return ((torch.arange(length) * 5 + offset) % 64).unsqueeze(0)


def _write_v1_prefix_cache(path, layers = 2, pages = 2):
    # Prefix cache in the v1 format, which stored every tensor in fp16
    full = lambda shape, v: [torch.full((pages, *shape), v, dtype = torch.half) for _ in range(layers)]
    torch.save({"hashes": ["0a1b", ""], "snapshots": [0, -1], "state": full((2, 8, 8), 0.25),
                "d": full((2, 4, 8), 0.5), "k": full((2, 4, 8), -0.5), "decay": full((2, 4, 8), -0.125)}, path)


def build_generator_admit(tmp_dir):
    model, cache = _setup(tmp_dir)
    gen = ExLlamaV2DynamicGenerator(model, cache)
    gen.enqueue(ExLlamaV2DynamicJob(_prompt(6), max_new_tokens = 4, identifier = 0))
    gen.enqueue(ExLlamaV2DynamicJob(_prompt(3, 1), max_new_tokens = 4, identifier = 1))
    gen.iterate()
    return {"cache": _rings(cache), "neutral_decay": gen.neutral_decay}


def build_generator_snapshots(tmp_dir):
    model, cache = _setup(tmp_dir)
    gen = ExLlamaV2DynamicGenerator(model, cache, max_snapshot_pages = 2)
    gen.enqueue(ExLlamaV2DynamicJob(_prompt(6), max_new_tokens = 4))
    gen.iterate()
    gen.snapshot_page(gen.all_pages[0], 0, 0)
    return {"cache": _rings(cache), "snapshots": _snaps(gen)}


def build_generator_snapshots_fp32_rings(tmp_dir):
    model, cache = _setup(tmp_dir, linear_attn_config = {"fp32_rings": True})
    gen = ExLlamaV2DynamicGenerator(model, cache, max_snapshot_pages = 2)
    gen.enqueue(ExLlamaV2DynamicJob(_prompt(6), max_new_tokens = 4))
    gen.iterate()
    gen.snapshot_page(gen.all_pages[0], 0, 1)
    gen.restore_page(gen.all_pages[0], 1)
    return {"cache": _rings(cache), "snapshots": _snaps(gen)}


def build_restore_prefix_cache(tmp_dir):
    model, cache = _setup(tmp_dir, linear_attn_config = {"fp32_rings": True})
    _write_v1_prefix_cache(f"{tmp_dir}/prefix_cache.pt")
    gen = ExLlamaV2DynamicGenerator(model, cache)
    gen.load_prefix_cache(f"{tmp_dir}/prefix_cache.pt")
    gen.restore_page(gen.all_pages[0], 1)
    return {"cache": _rings(cache), "snapshots": _snaps(gen)}


def build_restore_prefix_cache_into(tmp_dir):
    model, cache = _setup(tmp_dir, linear_attn_config = {"fp32_rings": True})
    _write_v1_prefix_cache(f"{tmp_dir}/prefix_cache.pt")
    gen = ExLlamaV2DynamicGenerator(model, cache, max_snapshot_pages = 2)
    gen.load_prefix_cache_into(f"{tmp_dir}/prefix_cache.pt")
    gen.restore_page(gen.all_pages[0], 1)
    return {"cache": _rings(cache), "snapshots": _snaps(gen)}


def build_generator_speculative(tmp_dir):
    model, cache = _setup(tmp_dir)
    gen = ExLlamaV2DynamicGenerator(model, cache, draft_model = model, draft_cache = ExLlamaV2Cache(model, batch_size = 2))
    gen.enqueue(ExLlamaV2DynamicJob(_prompt(5), max_new_tokens = 4))
    gen.iterate()
    gen.save_rollback()
    gen.iterate()
    gen.rollback([0])
    return {"cache": _rings(cache), "rollback": {"d": gen.rollback_d, "k": gen.rollback_k, "decay": gen.rollback_decay}}


def build_generator_warmup(tmp_dir):
    model, cache = _setup(tmp_dir)
    return {"cache": _rings(cache), "warmup": ExLlamaV2DynamicGenerator(model, cache).warmup()}
