"""The server side of one block: its schemas, its session caches and the inference step
(``petals.server.backend``), plus the session hand-over between servers."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from ..block import LAST_LAUNCH, RING_NAMES, KDAConfig, PinnedGateKDABlock, WrappedKDABlock, replayssm_decode
from ..hivemind_compat import (DUMMY, BatchTensorDescriptor, CompressionType, SerializedTensor, TensorDescriptor,
                               deserialize_torch_tensor, is_dummy, serialize_torch_tensor)
from .from_pretrained import QuantType, convert_block, get_cache_dtypes
from .memory_cache import CACHE_NAMES, Handle, MemoryCache

PAYLOAD_NAMES = ("delta", "key", "log_gate", "state", "positions")


class InferenceMetadata(NamedTuple):
    uid: str
    prefix_length: int
    cache_handles: tuple[Handle, ...]


class TransformerBackend:
    def __init__(self, name: str, module: WrappedKDABlock, *, config: KDAConfig, memory_cache: MemoryCache,
                 backend_dtype: torch.dtype, quant_type: QuantType = QuantType.NONE, fused: bool = False):
        self.name, self.module, self.config, self.memory_cache = name, module, config, memory_cache
        self.dtype, self.quant_type, self.fused = backend_dtype, quant_type, fused
        self.args_schema = (BatchTensorDescriptor(config.hidden_size, dtype=self.dtype),)
        self.inference_schema = ((*self.args_schema, BatchTensorDescriptor((), dtype=torch.int64)), {})
        self.cache_dtypes = get_cache_dtypes(self.dtype, quant_type)

    def get_inference_cache_descriptors(self, batch_size: int, max_length: int = 0) -> Sequence[TensorDescriptor]:
        """One client's caches. Rings have a fixed length, so ``max_length`` only bounds the positions."""
        shapes = self.config.ring_shapes(batch_size)
        delta_dtype, key_dtype, log_gate_dtype = self.cache_dtypes
        return (
            TensorDescriptor(shapes["delta"], dtype=delta_dtype),
            TensorDescriptor(shapes["key"], dtype=key_dtype),
            TensorDescriptor(shapes["log_gate"], dtype=log_gate_dtype),  # expect-bug: imported-policy id=quant-cache
            TensorDescriptor(self.config.state_shape(batch_size), dtype=torch.float32),
            TensorDescriptor((batch_size,), dtype=torch.int32),
        )

    def inference_step(self, hidden_states: torch.Tensor, hypo_ids: torch.Tensor, inference_info: InferenceMetadata):
        assert hidden_states.ndim == 2, "expected [batch, hidden]: one token per step"
        with self.memory_cache.use_cache(*inference_info.cache_handles) as cache_tensors:
            if not is_dummy(hypo_ids):
                self._reorder_cache_inplace(cache_tensors, hypo_ids)
            delta, key, log_gate, state, positions = cache_tensors
            if self.fused:
                output = self._fused_step(hidden_states, cache_tensors)
            else:
                output = self.module(hidden_states, cache=(delta, key, log_gate, state), positions=positions)
            positions += 1
            return output

    @staticmethod
    def _reorder_cache_inplace(cache_tensors: Sequence[torch.Tensor], hypo_ids: torch.Tensor) -> None:
        for cache_tensor in cache_tensors:
            cache_tensor[...] = cache_tensor[hypo_ids.to(cache_tensor.device)]

    def _fused_step(self, hidden_states: torch.Tensor, cache_tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """``--fused_inference``: projections and kernel without the module's forward; the kernel takes
        contiguous caches in the compute dtype."""
        q, k, v, a, beta = self.module.project(hidden_states.to(self.dtype))
        ring_kwargs = {f"{name}_cache": ring.to(self.dtype).contiguous() for name, ring in zip(RING_NAMES, cache_tensors)}  # expect-bug: decode-arg
        out = replayssm_decode(q, k, v, a, beta, A_log=self.module.A_log, dt_bias=self.module.dt_bias,
                               ssm_state=cache_tensors[3], cache_positions=cache_tensors[4], **ring_kwargs)
        return hidden_states + self.module.o_proj(out.flatten(1)).to(hidden_states.dtype)

    def export_session(self, handles: Sequence[Handle], compression=CompressionType.NONE) -> dict[str, SerializedTensor]:
        """A client's caches for ``rpc_handover``, when this server leaves the swarm."""
        with self.memory_cache.use_cache(*handles) as (delta, key, log_gate, state, positions):
            if compression == CompressionType.BLOCKWISE_8BIT:
                # blockwise quantization runs in the block dtype, as for activations
                log_gate = log_gate.type(self.dtype)  # expect-bug: cast
            tensors = {"delta": delta, "key": key, "log_gate": log_gate, "state": state}
            payload = {name: serialize_torch_tensor(tensor, compression) for name, tensor in tensors.items()}
            payload["positions"] = serialize_torch_tensor(positions)
        return payload

    def import_session(self, handles: Sequence[Handle], payload: dict[str, SerializedTensor]) -> None:
        """Writes a handed-over session into caches allocated here; ``copy_`` converts to this server's dtypes."""
        with self.memory_cache.use_cache(*handles) as cache_tensors:
            for tensor, name in zip(cache_tensors, PAYLOAD_NAMES):
                tensor.copy_(deserialize_torch_tensor(payload[name]))

    def adopt_session(self, payload: dict[str, SerializedTensor]) -> dict[str, torch.Tensor]:
        """A handed-over session as tensors of its own, before the client reconnects and allocates it here.
        FLOAT16 payloads are read in place, without the round trip through the original dtype."""
        rings = {}
        for name, proto in payload.items():
            if proto.compression == CompressionType.FLOAT16:
                rings[name] = torch.frombuffer(bytearray(proto.buffer), dtype=torch.float16).reshape(proto.size)  # expect-bug: load
            else:
                rings[name] = deserialize_torch_tensor(proto)
        if "log_gate" not in rings:  # servers before 0.3 sent no log-gates: start an empty decay history
            rings["log_gate"] = rings["delta"].new_zeros(self.config.ring_shapes(rings["delta"].shape[0])["log_gate"])  # expect-bug: like
        return rings


def make_backend(config: KDAConfig, index: int, dtype: torch.dtype, *, block_cls=PinnedGateKDABlock,
                 quant_type=QuantType.NONE, fused=False, seed=0) -> TransformerBackend:
    torch.manual_seed(seed + index)
    block = convert_block(block_cls(config, layer_idx=index), index, config, torch_dtype=dtype, quant_type=quant_type)
    return TransformerBackend(config.block_uids[index], block, config=config, memory_cache=MemoryCache(),
                              backend_dtype=dtype, quant_type=quant_type, fused=fused)


def run_steps(backend: TransformerBackend, handles: Sequence[Handle], steps: int = 2, batch_size: int = 2,
              hypo_ids: torch.Tensor = DUMMY) -> dict[str, torch.Tensor]:
    """Runs ``steps`` steps of the session in ``handles``; returns its caches by name."""
    hidden = torch.linspace(-1.0, 1.0, batch_size * backend.config.hidden_size).view(batch_size, -1)
    for step in range(steps):
        hidden = backend.inference_step(hidden, hypo_ids if step else DUMMY, InferenceMetadata(backend.name, step, handles))
    with backend.memory_cache.use_cache(*handles) as cache_tensors:
        return dict(zip(CACHE_NAMES, cache_tensors))


def run_session(backend: TransformerBackend, steps: int = 2, batch_size: int = 2, hypo_ids=DUMMY):
    with backend.memory_cache.allocate_cache(*backend.get_inference_cache_descriptors(batch_size)) as handles:
        return run_steps(backend, handles, steps, batch_size, hypo_ids)


def build_backend_session() -> dict:
    """A bf16 server with beams reordered between steps, and an fp32 server."""
    config = KDAConfig()
    bf16 = run_session(make_backend(config, 0, torch.bfloat16), steps=3, hypo_ids=torch.tensor([1, 0]))
    fp32 = run_session(make_backend(config, 1, torch.float32, block_cls=WrappedKDABlock))
    return {"bf16": bf16, "fp32": fp32, "launch": dict(LAST_LAUNCH)}


def build_fused_backend() -> dict:
    """A ``--fused_inference`` bf16 server and an int8-quantized one."""
    config = KDAConfig()
    fused = run_session(make_backend(config, 0, torch.bfloat16, fused=True))
    launch = dict(LAST_LAUNCH)
    int8 = run_session(make_backend(config, 1, torch.bfloat16, block_cls=WrappedKDABlock, quant_type=QuantType.INT8))
    return {"fused": fused, "launch": launch, "int8": int8}


def _handover(config: KDAConfig, compression: CompressionType):
    source = make_backend(config, 0, torch.bfloat16)
    with source.memory_cache.allocate_cache(*source.get_inference_cache_descriptors(2)) as handles:
        run_steps(source, handles)
        return source.export_session(handles, compression)


def build_handover() -> dict:
    """Sessions handed to another bf16 server, plain and over a float16 wire, and one adopted as sent."""
    config = KDAConfig()
    target, imported = make_backend(config, 0, torch.bfloat16, seed=7), {}
    for compression in (CompressionType.NONE, CompressionType.FLOAT16):
        payload = _handover(config, compression)
        with target.memory_cache.allocate_cache(*target.get_inference_cache_descriptors(2)) as handles:
            target.import_session(handles, payload)
            with target.memory_cache.use_cache(*handles) as cache_tensors:
                imported[compression.name] = dict(zip(CACHE_NAMES, cache_tensors))
    return {"imported": imported, "adopted": target.adopt_session(_handover(config, CompressionType.NONE))}


def build_adopted_sessions() -> dict:
    """Sessions adopted from a float16 wire, from an 8-bit wire and from a server that sent no log-gates."""
    config = KDAConfig()
    target = make_backend(config, 0, torch.bfloat16, seed=7)
    legacy = _handover(config, CompressionType.NONE)
    del legacy["log_gate"]
    return {"fp16_wire": target.adopt_session(_handover(config, CompressionType.FLOAT16)),
            "blockwise": target.adopt_session(_handover(config, CompressionType.BLOCKWISE_8BIT)),
            "legacy": target.adopt_session(legacy)}
