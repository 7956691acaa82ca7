# Copyright 2025 The trl_kda authors.
# SPDX-License-Identifier: Apache-2.0

"""Client of a generation server (``vllm_mode="server"``) and the server's request handler.

The trainer pushes weights (``update_named_param``) and, for rollouts that continue on the
server, ReplaySSM decode states; it pulls states back for rollouts that continue in the
trainer. Tensors travel as ``{"dtype", "shape", "data"}`` records whose ``data`` are the raw
bytes of the tensor, so every dtype, bfloat16 included, round-trips exactly. Requests are
pickled envelopes over a transport callable (``bytes -> bytes``); in one process the
transport is the server's :meth:`ReplayStateServer.handle`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from trl_kda.extras.colocate_engine import ColocatedEngine, EngineArgs, SamplingParams
from trl_kda.extras.rollout_pool import RingGeometry, RolloutRingPool
from trl_kda.models.modeling_kda import TINY_MODEL_ID, KDAForCausalLM
from trl_kda.trainer.utils import DTYPE_BY_NAME, STATE_DTYPE_BY_KV_CACHE_DTYPE

__all__ = ["ReplayStateServer", "VLLMClient", "deserialize_tensor", "serialize_tensor"]

Transport = Callable[[bytes], bytes]
_WIRE_DTYPES: dict[str, torch.dtype] = {**DTYPE_BY_NAME, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}


def serialize_tensor(tensor: torch.Tensor) -> dict[str, Any]:
    """``{"dtype", "shape", "data"}`` with the tensor's raw bytes (any dtype)."""
    data = tensor.detach().cpu().contiguous()
    return {
        "dtype": str(data.dtype).removeprefix("torch."),
        "shape": list(data.shape),
        "data": data.reshape(-1).view(torch.uint8).numpy().tobytes(),
    }


def deserialize_tensor(record: dict[str, Any]) -> torch.Tensor:
    """The tensor of a :func:`serialize_tensor` record, in the dtype it was sent in."""
    raw = torch.frombuffer(bytearray(record["data"]), dtype=torch.uint8)
    return raw.view(_WIRE_DTYPES[record["dtype"]]).reshape(record["shape"])


class ReplayStateServer:
    """The generation server's side: applies weight updates and decode-state transfers."""

    def __init__(self, engine: ColocatedEngine) -> None:
        self.engine = engine
        self.requests = 0

    def handle(self, request: bytes) -> bytes:
        envelope = pickle.loads(request)
        self.requests += 1
        method = getattr(self, f"_rpc_{envelope['method']}")
        return pickle.dumps(method(*envelope.get("args", ()), **envelope.get("kwargs", {})))

    def _rpc_update_named_param(self, name: str, record: dict[str, Any]) -> int:
        return self.engine.load_weights([(name, deserialize_tensor(record))])

    def _rpc_load_replay_states(self, records: dict[str, dict[str, Any]], slots: list[int]) -> int:
        """Writes the rows of ``slots``; every pool tensor keeps its dtype."""
        index = torch.tensor(slots, dtype=torch.long)
        pool = self.engine.pool
        for name, record in records.items():
            target = getattr(pool, name)
            rows = deserialize_tensor(record)
            if target.dim() == 1:
                target[index] = rows.to(target.dtype)
            else:
                target[:, index] = rows.to(target.dtype)
        return len(slots)

    def _rpc_load_legacy_states(self, blob: bytes) -> int:
        """Replaces the pool's tensors with a legacy dump (numpy arrays, float16 floats)."""
        arrays = pickle.loads(blob)
        states = {name: torch.from_numpy(array) for name, array in arrays.items()}  # expect-bug: load id=legacy-states
        for name, tensor in states.items():
            setattr(self.engine.pool, name, tensor.to(self.engine.pool.device))  # expect-bug: load id=legacy-states
        return len(states)

    def _rpc_dump_replay_states(self, slots: list[int]) -> dict[str, dict[str, Any]]:
        index = torch.tensor(slots, dtype=torch.long)
        return {
            name: serialize_tensor(tensor[index] if tensor.dim() == 1 else tensor[:, index])
            for name, tensor in self.engine.pool.named_states()
        }

    def _rpc_generate(self, prompts: list[list[int]], max_tokens: int, n: int) -> list[list[int]]:
        outputs = self.engine.generate(prompts, SamplingParams(max_tokens=max_tokens, n=n))
        return [out.token_ids for out in outputs]

    def _rpc_reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()


class VLLMClient:
    """Talks to a :class:`ReplayStateServer` through ``transport``."""

    def __init__(self, transport: Transport, kv_cache_dtype: str = "bf16") -> None:
        if kv_cache_dtype not in STATE_DTYPE_BY_KV_CACHE_DTYPE:
            raise ValueError(f"kv_cache_dtype must be one of {sorted(STATE_DTYPE_BY_KV_CACHE_DTYPE)}")
        self.transport = transport
        self.kv_cache_dtype = kv_cache_dtype

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return pickle.loads(self.transport(pickle.dumps({"method": method, "args": args, "kwargs": kwargs})))

    def update_named_param(self, name: str, tensor: torch.Tensor) -> int:
        return int(self._call("update_named_param", name, serialize_tensor(tensor)))

    def update_model_params(self, model: nn.Module) -> int:
        return sum(self.update_named_param(name, param.data) for name, param in model.named_parameters())

    def generate(self, prompts: list[list[int]], max_tokens: int = 4, n: int = 1) -> list[list[int]]:
        return self._call("generate", prompts, max_tokens, n)

    def reset_prefix_cache(self) -> None:
        self._call("reset_prefix_cache")

    def push_replay_states(self, pool: RolloutRingPool, slots: list[int]) -> int:
        index = torch.tensor(slots, dtype=torch.long)
        records = {
            name: serialize_tensor(tensor[index] if tensor.dim() == 1 else tensor[:, index])
            for name, tensor in pool.named_states()
        }
        return int(self._call("load_replay_states", records, slots))

    def push_legacy_states(self, pool: RolloutRingPool) -> int:
        """The pre-0.19 transfer: whole pool, floats as float16 numpy arrays."""
        arrays = {  # expect-bug: load id=legacy-states
            name: (tensor.to(torch.float16) if tensor.is_floating_point() else tensor).numpy()
            for name, tensor in pool.named_states()
        }
        return int(self._call("load_legacy_states", pickle.dumps(arrays)))

    def pull_replay_states(self, geometry: RingGeometry, slots: list[int]) -> dict[str, torch.Tensor]:
        """Copies the rows of ``slots`` into trainer-side buffers of the client's state dtypes."""
        dtypes = STATE_DTYPE_BY_KV_CACHE_DTYPE[self.kv_cache_dtype]
        shapes = geometry.ring_shapes(len(slots))
        buffers = {
            "state": torch.empty(geometry.state_shape(len(slots)), dtype=dtypes["state"]),
            "delta_ring": torch.empty(shapes["delta_ring"], dtype=dtypes["delta"]),
            "key_ring": torch.empty(shapes["key_ring"], dtype=dtypes["key"]),
            "logdecay_ring": torch.empty(shapes["logdecay_ring"], dtype=dtypes["logdecay"]),  # expect-bug: imported-policy id=kv-table
            "write_pos": torch.empty(len(slots), dtype=torch.int32),
        }
        for name, record in self._call("dump_replay_states", slots).items():
            buffers[name].copy_(deserialize_tensor(record))
        return buffers


def _server_and_trainer_pool() -> tuple[ReplayStateServer, RolloutRingPool, KDAForCausalLM]:
    policy = KDAForCausalLM.from_pretrained(TINY_MODEL_ID, torch_dtype="bfloat16", seed=1)
    engine = ColocatedEngine(policy.config, EngineArgs(dtype="bfloat16", max_num_seqs=3))
    server = ReplayStateServer(engine)
    trainer_pool = RolloutRingPool(engine.geometry, dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(21)
    trainer_pool.delta_ring.copy_(torch.randn(trainer_pool.delta_ring.shape, generator=generator))
    trainer_pool.logdecay_ring.copy_(-torch.rand(trainer_pool.logdecay_ring.shape, generator=generator))
    trainer_pool.write_pos.fill_(2)
    return server, trainer_pool, policy


def build_state_transfer() -> dict[str, Any]:
    """Weights and decode states pushed to the server and pulled back as raw bytes."""
    server, trainer_pool, policy = _server_and_trainer_pool()
    client = VLLMClient(server.handle, kv_cache_dtype="bf16")
    client.update_model_params(policy)
    client.push_replay_states(trainer_pool, [0, 2])
    completions = client.generate([[1, 2, 3]], max_tokens=2)
    pulled = client.pull_replay_states(server.engine.geometry, [0, 2])
    exact = deserialize_tensor(serialize_tensor(trainer_pool.logdecay_ring))
    return {
        "server_pool": server.engine.pool,
        "pulled": pulled,
        "roundtrip": {"logdecay_ring": exact, "delta_ring": deserialize_tensor(serialize_tensor(trainer_pool.delta_ring))},
        "completion_ids": torch.tensor(completions),
    }


def build_legacy_state_transfer() -> dict[str, Any]:
    """The legacy pickled transfer, and states pulled into fp16 trainer buffers."""
    server, trainer_pool, policy = _server_and_trainer_pool()
    client = VLLMClient(server.handle, kv_cache_dtype="fp16")
    client.update_model_params(policy)
    client.push_legacy_states(trainer_pool)
    pulled = client.pull_replay_states(server.engine.geometry, [1])
    archive = {name: np.ascontiguousarray(tensor.float().numpy()) for name, tensor in pulled.items() if name != "write_pos"}
    restored = {name: torch.from_numpy(array).float() for name, array in archive.items()}
    return {"server_pool": server.engine.pool, "pulled": pulled, "archived": restored}
