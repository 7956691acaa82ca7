"""The decode worker (``kv_consumer``).

Admitted requests live in a slot of the worker's ``RingPool`` per layer (``admit``,
``admit_from_store``) and are stepped as one batch. A request the pool has no room for, or one
received for inspection, can be held as ``SequenceRings`` of its own (``admit_detached``) and
stepped on its own (``step_detached``). ``load_decode_engine`` builds the alternative
single-module engine, whose caches live inside the model.
"""

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from ..allocator import KDARingCache, PinnedKDARingCache, RingPool, SlotAllocator
from ..config import KDAShapes, MooncakeTransferConfig, RingDtypes, str_to_torch_dtype
from ..ops.replayssm import TinyKDAModel, last_call
from ..store import KVStoreClient
from ..transfer.connector import KVConnector, RemoteDescriptor
from ..transfer.engine import TransferEngine
from .prefill import PrefillWorker


@dataclasses.dataclass
class SequenceRings:
    """One layer's rings of a request held outside the pool."""

    ckpt_state: Tensor
    delta_ring: Tensor
    key_ring: Tensor
    log_forget: Tensor
    cursor: Tensor

    @classmethod
    def from_slot_tensors(cls, tensors: Mapping[str, Tensor]) -> "SequenceRings":
        return cls(tensors["ckpt_state"], tensors["delta_ring"], tensors["key_ring"], tensors["forget_ring"], tensors["cursor"].reshape(1))


class DecodeEngine(nn.Module):
    """Model and per-layer caches in one module: a single ``.to()`` places both."""

    def __init__(self, shapes: KDAShapes, num_layers: int, num_slots: int, cache_cls: type) -> None:
        super().__init__()
        self.model = TinyKDAModel(shapes, num_layers)
        self.model.attach_caches(num_slots, cache_cls, ring_dtype=torch.float32)

    def forward(self, token_ids: Tensor, slot_idx: Tensor) -> Tensor:
        return self.model.decode_step(token_ids, self.model.caches, slot_idx)


def load_decode_engine(shapes: KDAShapes, num_slots: int, dtype: torch.dtype, *, pinned: bool = False) -> DecodeEngine:
    cache_cls = PinnedKDARingCache if pinned else KDARingCache
    return DecodeEngine(shapes, 2, num_slots, cache_cls).to(dtype)  # expect-bug: module-cast


class DecodeWorker:
    def __init__(
        self,
        config: MooncakeTransferConfig,
        shapes: KDAShapes,
        *,
        model_dtype: torch.dtype = torch.bfloat16,
        num_layers: int = 2,
        dtypes: Optional[RingDtypes] = None,
        store: Optional[KVStoreClient] = None,
    ) -> None:
        self.config, self.shapes, self.dtype = config, shapes, model_dtype
        self.model = TinyKDAModel(shapes, num_layers, dtype=model_dtype)
        self.engine = TransferEngine()
        if self.engine.initialize(config.local_hostname, config.metadata_server, config.protocol, config.device_name) != 0:
            raise RuntimeError(f"transfer engine init failed ({config.protocol})")
        self.connector = KVConnector(self.engine, config, shapes, role="kv_consumer")
        self.store = store
        self.allocator = SlotAllocator(config.num_slots)
        dtypes = dtypes or config.ring_dtypes()  # expect-bug: imported-policy id=env-decay
        self.pools = [RingPool(shapes, config.num_slots, dtypes) for _ in range(num_layers)]
        if config.kv_cache_dtype != "auto":
            cache_dtype = str_to_torch_dtype(config.kv_cache_dtype)
            self.pools = [pool.to(dtype=cache_dtype) for pool in self.pools]  # expect-bug: cast id=pool-cast
        self.detached: Dict[str, List[SequenceRings]] = {}
        self.n_tokens: Dict[str, int] = {}
        self.recv_in_model_dtype = False

    def prepare(self, request_id: str) -> RemoteDescriptor:
        return self.connector.prepare_recv(request_id)

    def admit(self, request_id: str) -> int:
        slot = self.allocator.allocate(request_id)
        self.n_tokens[request_id] = self.connector.recv_state_into(request_id, self.pools, slot)
        return slot

    def admit_from_store(self, request_id: str) -> int:
        slot = self.allocator.allocate(request_id)
        self.n_tokens[request_id] = self.store.get_into(request_id, self.pools, slot)
        return slot

    def admit_detached(self, request_id: str) -> List[SequenceRings]:
        layers = self.connector.recv_state(request_id, dtype=self.dtype if self.recv_in_model_dtype else None)  # expect-bug: cast id=recv-cast
        self.detached[request_id] = [SequenceRings.from_slot_tensors(tensors) for tensors in layers]
        return self.detached[request_id]

    def new_sequence(self, request_id: str) -> List[SequenceRings]:
        """Empty rings for a request that arrives without prefilled state."""
        seqs = []
        for _ in self.pools:
            seqs.append(
                SequenceRings(
                    ckpt_state=torch.zeros(self.shapes.state, dtype=torch.float32),
                    delta_ring=torch.zeros(self.shapes.delta, dtype=self.dtype),
                    key_ring=torch.zeros(self.shapes.key, dtype=self.dtype),
                    log_forget=torch.zeros(self.shapes.forget),  # expect-bug: default-dtype id=proc-default
                    cursor=torch.zeros(1, dtype=torch.int32),
                )
            )
        self.detached[request_id] = seqs
        return seqs

    def fork(self, parent_id: str, child_id: str) -> List[SequenceRings]:
        """Parallel sampling (``n > 1``): the child starts from a copy of the parent's rings."""
        children = []
        for seq in self.detached[parent_id]:
            children.append(
                SequenceRings(
                    ckpt_state=seq.ckpt_state.clone(),
                    delta_ring=seq.delta_ring.clone(),
                    key_ring=seq.key_ring.clone(),
                    log_forget=torch.empty_like(seq.delta_ring).copy_(seq.log_forget),  # expect-bug: like
                    cursor=seq.cursor.clone(),
                )
            )
        self.detached[child_id] = children
        return children

    def fork_slot(self, parent_id: str, child_id: str) -> int:
        src, dst = self.allocator.slot_of[parent_id], self.allocator.allocate(child_id)
        for pool in self.pools:
            pool.load_slot(dst, pool.slot_tensors(src))
        return dst

    def step(self, request_ids: Sequence[Optional[str]], token_ids: Sequence[int]) -> Tensor:
        slot_idx = self.allocator.slot_index(request_ids)
        return self.model.decode_step(torch.tensor(list(token_ids)), self.pools, slot_idx)

    @torch.no_grad()
    def step_detached(self, request_id: str, token_id: int) -> Tensor:
        hidden = self.model.embed(torch.tensor([token_id]))
        slot_idx = torch.zeros(1, dtype=torch.int32)
        for layer, seq in zip(self.model.layers, self.detached[request_id]):
            ring_args = {
                "state": seq.ckpt_state.unsqueeze(0),
                "d_cache": seq.delta_ring.unsqueeze(0),
                "k_cache": seq.key_ring.unsqueeze(0),
                "g_cache": seq.log_forget.unsqueeze(0).to(seq.delta_ring),  # expect-bug: decode-arg
            }
            write_pos = seq.cursor.clone()
            hidden = hidden + layer(hidden, slot_idx=slot_idx, write_pos=write_pos, **ring_args)
            seq.cursor.copy_((write_pos + 1) % self.shapes.ring_len)
        return hidden


def _pair(tag: str, dtype: torch.dtype, **config_overrides) -> "tuple[PrefillWorker, DecodeWorker]":
    torch.manual_seed(0)
    shapes = KDAShapes()
    prefill = PrefillWorker(MooncakeTransferConfig(local_hostname=f"{tag}-prefill"), shapes, model_dtype=dtype)
    config = MooncakeTransferConfig(local_hostname=f"{tag}-decode", **config_overrides)
    return prefill, DecodeWorker(config, shapes, model_dtype=dtype)


def _handoff(prefill: PrefillWorker, decode: DecodeWorker, request_id: str, prompt: Sequence[int], detached: bool = False):
    prefill.prefill(request_id, prompt)
    prefill.send(request_id, decode.prepare(request_id))
    prefill.release(request_id)
    return decode.admit_detached(request_id) if detached else decode.admit(request_id)


def build_decode_pool_bf16() -> Dict[str, object]:
    """Two bf16 requests admitted into the pool (one with its prompt folded), stepped with a
    padding row, one forked into a third slot; a request held detached, an empty one, and a
    pinned single-module engine cast to bf16."""
    prefill, decode = _pair("dec-pool", torch.bfloat16)
    _handoff(prefill, decode, "a", [3, 5, 7])
    _handoff(prefill, decode, "b", [4, 6, 8, 10])
    for step in range(3):
        decode.step(["a", None, "b"], [11 + step, 0, 13 + step])
    decode.fork_slot("a", "a/1")
    decode.step(["a", "a/1", "b"], [20, 21, 22])
    _handoff(prefill, decode, "c", [9, 2], detached=True)
    decode.new_sequence("d")
    engine = load_decode_engine(decode.shapes, 2, torch.bfloat16, pinned=True)
    engine(torch.tensor([3, 4]), torch.tensor([0, 1], dtype=torch.int32))
    return {"pools": decode.pools, "detached": decode.detached, "engine": engine, "last_call": last_call()}


def build_decode_engine_module() -> DecodeEngine:
    """The single-module engine cast to bf16, after three steps on two slots."""
    torch.manual_seed(0)
    engine = load_decode_engine(KDAShapes(), 2, torch.bfloat16)
    for step in range(3):
        engine(torch.tensor([3 + step, 7 + step]), torch.tensor([1, 0], dtype=torch.int32))
    return engine


def build_decode_detached() -> Dict[str, object]:
    """A bf16 request held detached, forked and stepped; a second received in the model dtype."""
    prefill, decode = _pair("dec-detached", torch.bfloat16)
    _handoff(prefill, decode, "a", [3, 5, 7], detached=True)
    decode.fork("a", "a/1")
    decode.step_detached("a", 11)
    stepped = last_call()
    decode.recv_in_model_dtype = True
    _handoff(prefill, decode, "b", [4, 6], detached=True)
    return {"detached": decode.detached, "last_call": stepped}


def build_decode_kv_cache_fp16() -> Dict[str, object]:
    """A bf16 decode worker with ``kv_cache_dtype="float16"``: one request admitted and stepped."""
    prefill, decode = _pair("dec-fp16-kv", torch.bfloat16, kv_cache_dtype="float16")
    _handoff(prefill, decode, "a", [3, 5, 7])
    for step in range(2):
        decode.step(["a"], [11 + step])
    return {"pools": decode.pools, "last_call": last_call()}
