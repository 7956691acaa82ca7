"""
Worker pool behind the chat server: one model replica per GPU; the replay caches of idle conversations
are parked in host memory (or swapped to disk) so multi-turn chats don't re-prefill.
"""

import os
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from nanochat_kda.common import compute_dtype
from nanochat_kda.engine import RINGS, Engine, _chat, tiny_model


@dataclass
class Worker:
    gpu_id: int
    device: torch.device
    engine: Engine
    autocast_ctx: object
    sessions: dict = field(default_factory=dict) # conversation id -> (parked rings, pos)


class WorkerPool:
    """Pool of workers, each with a model replica on a different GPU."""

    def __init__(self, model_fn, num_gpus=1, device_type="cpu", half=False, max_parked=2):
        self.device_type, self.half = device_type, half
        self.park_dtypes = {name: compute_dtype(device_type) for name in RINGS[:3]} # expect-bug: imported-policy id=park-dtype
        self.workers, self.available = [], deque()
        for gpu_id in range(num_gpus):
            model = model_fn().to(device := torch.device(device_type))
            if half: # fp16 replicas for devices without bf16 (mps, older gpus)
                model = model.half() # expect-bug: module-cast
            ctx = torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16) if device_type == "cuda" else nullcontext()
            worker = Worker(gpu_id, device, Engine(model), ctx)
            self.workers.append(worker)
            self.available.append(worker)
        # host buffers the parked rings are copied into, allocated once (the states are parked as they are)
        shapes, host_dtype = Engine(model)._new_cache(1).shapes, self.park_dtypes["d_cache"] # expect-bug: pool-dtype id=host-pool
        self.host_pool = [{name: torch.zeros(shapes[name], dtype=host_dtype) for name in RINGS[:3]} for _ in range(max_parked)] # expect-bug: pool-dtype id=host-pool

    def acquire_worker(self):
        return self.available.popleft()

    def release_worker(self, worker):
        self.available.append(worker)

    def park(self, worker, sid, cache, compact=False):
        # move an idle conversation's cache to host memory; compact: rings in the compute dtype, half the footprint
        dtypes = self.park_dtypes if compact else {}
        rings = {name: getattr(cache, name).to("cpu", dtype=dtypes.get(name)) for name in RINGS} # expect-bug: imported-policy id=park-dtype
        worker.sessions[sid] = rings, cache.pos

    def park_pooled(self, worker, sid, cache, slot=0):
        # same as park, but into the preallocated host buffers (copy_ casts into their dtype)
        buf = self.host_pool[slot]
        for name in RINGS[:3]:
            buf[name].copy_(getattr(cache, name))
        worker.sessions[sid] = {**buf, "s_cache": cache.s_cache.cpu()}, cache.pos

    def resume(self, worker, sid, cache):
        rings, cache.pos = worker.sessions.pop(sid)
        for name, t in rings.items():
            setattr(cache, name, t)
        if self.half: # fp16 replicas run fp16 caches
            return cache.half_()
        return cache.move_to(next(worker.engine.model.parameters()))

    def swap_out(self, worker, sid, swap_dir):
        # conversations idle for long go to disk; numpy has no bf16 so rings are written as fp16
        rings, pos = worker.sessions.pop(sid)
        os.makedirs(swap_dir, exist_ok=True)
        for name, t in rings.items():
            np.save(os.path.join(swap_dir, f"{sid}.{name}.npy"), (t if name == "s_cache" else t.half()).numpy())
        worker.sessions[sid] = None, pos

    def swap_in(self, worker, sid, swap_dir, cache):
        _, cache.pos = worker.sessions.pop(sid)
        for name in RINGS:
            t = torch.from_numpy(np.load(os.path.join(swap_dir, f"{sid}.{name}.npy"))) # expect-bug: load id=np-swap
            setattr(cache, name, t if name in ("la_cache", "s_cache") else t.to(compute_dtype(self.device_type))) # expect-bug: load id=np-swap
        return cache

    def import_session(self, worker, sid, d, k, alpha, s, pos):
        # sessions handed over by the training-side exporter: per-step decay factors alpha instead of log-decays
        la = torch.stack([torch.log(a) for a in alpha.unbind(0)]) # expect-bug: promotion
        worker.sessions[sid] = {"d_cache": d, "k_cache": k, "la_cache": la, "s_cache": s.float()}, pos


def _model_fn(static_batch=0):
    return tiny_model(static_batch=static_batch)


def build_worker_pool():
    pool = WorkerPool(_model_fn)
    worker = pool.acquire_worker()
    _, cache = _chat(worker.engine)
    pool.park(worker, "chat-0", cache)
    resumed = pool.resume(worker, "chat-0", worker.engine._new_cache(2))
    pool.release_worker(worker)
    return {"worker": worker, "resumed": resumed}


def build_parked_sessions(tmp_dir):
    pool = WorkerPool(_model_fn)
    worker = pool.acquire_worker()
    caches = [_chat(worker.engine, num_samples=1)[1] for _ in range(3)]
    pool.park(worker, "compact", caches[0], compact=True)
    pool.park_pooled(worker, "pooled", caches[1])
    pool.park(worker, "swapped", caches[2])
    pool.swap_out(worker, "swapped", tmp_dir)
    swapped = pool.swap_in(worker, "swapped", tmp_dir, worker.engine._new_cache(1))
    c = caches[2]
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        x = worker.engine.model.transformer.wte(torch.tensor([[1, 2, 3, 4]]))
        alpha = torch.stack([block.attn.decay_factors(x).transpose(1, 2) for block in worker.engine.model.transformer.h])
    pool.import_session(worker, "imported", c.d_cache, c.k_cache, alpha, c.s_cache, c.pos)
    return {"sessions": worker.sessions, "host_pool": pool.host_pool, "swapped": swapped}


def build_half_workers():
    pool = WorkerPool(lambda: _model_fn(static_batch=1), half=True)
    worker = pool.acquire_worker()
    _, cache = _chat(worker.engine, num_samples=1)
    pool.park(worker, "chat-0", cache)
    return {"model": worker.engine.model, "resumed": pool.resume(worker, "chat-0", worker.engine._new_cache(1))}
