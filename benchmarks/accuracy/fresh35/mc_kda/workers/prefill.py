"""The prefill worker (``kv_producer``).

It owns a model with in-model ring caches (one ``KDARingCache`` per layer), runs each prompt on a
cache slot and hands the request's slots to a decode worker: point to point through the
connector (``send``) or through the store (``publish``). Prompts shorter than the ring can skip
the slot: ``prefill_chunked`` computes their rows in one pass per layer.
"""

import logging
from typing import Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..allocator import KDARingCache, PinnedKDARingCache, SlotAllocator
from ..config import KDAShapes, MooncakeTransferConfig, set_default_torch_dtype, torch_dtype_to_str
from ..ops.replayssm import TinyKDAModel, chunk_delta_rule
from ..store import KVStoreClient
from ..transfer.connector import KVConnector, RemoteDescriptor
from ..transfer.engine import TransferEngine
from ..transfer.metadata import WireFormat

logger = logging.getLogger(__name__)


class PrefillWorker:
    def __init__(
        self,
        config: MooncakeTransferConfig,
        shapes: KDAShapes,
        *,
        model_dtype: torch.dtype = torch.bfloat16,
        num_layers: int = 2,
        preallocate_caches: bool = False,
        pinned_caches: bool = False,
    ) -> None:
        self.config, self.shapes, self.dtype = config, shapes, model_dtype
        cache_cls = PinnedKDARingCache if pinned_caches else KDARingCache
        # Weights are created directly in the serving dtype (no float32 copy on the host).
        with set_default_torch_dtype(model_dtype):
            self.model = TinyKDAModel(shapes, num_layers, cache_slots=config.num_slots if preallocate_caches else None, cache_cls=cache_cls)  # expect-bug: default-dtype id=init-dtype
        if self.model.caches is None:
            self.model.attach_caches(config.num_slots, cache_cls)
        self.engine = TransferEngine()
        if self.engine.initialize(config.local_hostname, config.metadata_server, config.protocol, config.device_name) != 0:
            raise RuntimeError(f"transfer engine init failed ({config.protocol})")
        self.connector = KVConnector(self.engine, config, shapes, role="kv_producer")
        self.allocator = SlotAllocator(config.num_slots)
        self.n_tokens: Dict[str, int] = {}

    def prefill(self, request_id: str, prompt: Sequence[int]) -> int:
        slot = self.allocator.allocate(request_id)
        for cache in self.model.caches:
            cache.reset_slot(slot)
        slot_idx = torch.tensor([slot], dtype=torch.int32)
        for token in prompt:
            self.model.decode_step(torch.tensor([token]), self.model.caches, slot_idx)
        self.n_tokens[request_id] = len(prompt)
        return slot

    def export(self, request_id: str) -> List[Dict[str, Tensor]]:
        slot = self.allocator.slot_of[request_id]
        return [cache.slot_tensors(slot) for cache in self.model.caches]

    def send(self, request_id: str, peer: RemoteDescriptor, wire_format: Optional[WireFormat] = None) -> int:
        return self.connector.send_state(
            request_id,
            self.export(request_id),
            peer,
            n_tokens=self.n_tokens[request_id],
            model_dtype=torch_dtype_to_str(self.dtype),
            wire_format=wire_format,
        )

    def publish(self, request_id: str, client: KVStoreClient) -> List[str]:
        return client.put_state(request_id, self.export(request_id), n_tokens=self.n_tokens[request_id], model_dtype=torch_dtype_to_str(self.dtype))

    def release(self, request_id: str) -> None:
        self.allocator.free(request_id)
        self.n_tokens.pop(request_id, None)

    @torch.no_grad()
    def prefill_chunked(self, request_id: str, prompt: Sequence[int]) -> List[Dict[str, Tensor]]:
        """The slot tensors a prompt of fewer than ``ring_len`` tokens leaves, without a slot."""
        steps, s = len(prompt), self.shapes
        if steps >= s.ring_len:
            raise ValueError(f"{request_id}: {steps} tokens do not fit a {s.ring_len}-row ring")
        hidden = self.model.embed(torch.tensor(list(prompt)))
        layers = []
        for layer in self.model.layers:
            q, k, v, a, b = layer.project(hidden)
            g = -layer.A_log.exp().unsqueeze(-1) * F.softplus(a.unflatten(-1, (s.num_v_heads, s.head_k_dim)) + layer.dt_bias.view(s.num_v_heads, -1))  # expect-bug: promotion id=chunk-gate
            deltas, keys, out = chunk_delta_rule(q, k, v, g, b)
            rest = s.ring_len - steps
            layers.append(
                {
                    "ckpt_state": torch.zeros(s.state, dtype=torch.float32),
                    "delta_ring": torch.cat([deltas, deltas.new_zeros(s.num_v_heads, rest, s.head_v_dim)], dim=1).to(self.dtype),
                    "key_ring": torch.cat([keys, keys.new_zeros(s.num_heads, rest, s.head_k_dim)], dim=1).to(self.dtype),
                    "forget_ring": torch.cat([g.transpose(0, 1), g.new_zeros(s.num_v_heads, rest, s.head_k_dim)], dim=1),  # expect-bug: promotion id=chunk-gate
                    "cursor": torch.tensor(steps, dtype=torch.int32),
                }
            )
            hidden = hidden + layer.o_proj(out.flatten(1).to(hidden.dtype))
        self.n_tokens[request_id] = steps
        return layers

    def update_weights(self, named_tensors: Mapping[str, Tensor]) -> None:
        """Loads weights pushed by the trainer; the pushed dtype becomes the serving dtype."""
        incoming = next(iter(named_tensors.values())).dtype
        if incoming != self.dtype:
            logger.info("serving dtype %s -> %s", self.dtype, incoming)
            self.model.to(incoming)  # expect-bug: module-cast
            self.dtype = incoming
        self.model.load_state_dict(dict(named_tensors), strict=False)


def _worker(tag: str, dtype: torch.dtype, **kwargs) -> PrefillWorker:
    torch.manual_seed(0)
    return PrefillWorker(MooncakeTransferConfig(local_hostname=f"{tag}-prefill"), KDAShapes(), model_dtype=dtype, **kwargs)


def _pushed_weights(dtype: torch.dtype, seed: int = 1) -> Dict[str, Tensor]:
    torch.manual_seed(seed)
    trainer = TinyKDAModel(KDAShapes(), dtype=torch.float32)
    return {name: tensor.to(dtype) for name, tensor in trainer.state_dict().items()}


def build_prefill_bf16() -> Dict[str, object]:
    """Two bf16 prompts on the worker's slots; a worker with pinned caches that takes an fp16
    weight push and runs a third."""
    worker = _worker("pf-bf16", torch.bfloat16)
    worker.prefill("a", [3, 5, 7])
    worker.prefill("b", [4, 6, 8, 10, 12])
    pinned = _worker("pf-pinned", torch.bfloat16, pinned_caches=True)
    pinned.update_weights(_pushed_weights(torch.float16))
    pinned.prefill("c", [9, 2])
    return {"a": worker.export("a"), "b": worker.export("b"), "model": worker.model, "pinned": pinned.model}


def build_prefill_preallocated() -> Dict[str, object]:
    """A bf16 worker whose caches are allocated with the model, after one prompt."""
    worker = _worker("pf-prealloc", torch.bfloat16, preallocate_caches=True)
    worker.prefill("a", [3, 5, 7])
    return {"model": worker.model, "a": worker.export("a")}


def build_prefill_weight_sync() -> Dict[str, object]:
    """A float32 worker that takes a bf16 weight push between two prompts."""
    worker = _worker("pf-sync", torch.float32)
    worker.prefill("a", [3, 5, 7])
    worker.update_weights(_pushed_weights(torch.bfloat16))
    worker.prefill("b", [4, 6])
    return {"model": worker.model, "a": worker.export("a"), "b": worker.export("b")}


def build_prefill_chunked() -> List[Dict[str, Tensor]]:
    """A two-token prompt on a bf16 worker, computed without a slot."""
    return _worker("pf-chunked", torch.bfloat16).prefill_chunked("a", [3, 5])
