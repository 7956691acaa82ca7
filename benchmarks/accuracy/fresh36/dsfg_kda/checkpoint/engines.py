"""Checkpoint engines: model weights for the policies, and the SSM state of an engine's
sequences (``InferenceEngineV2.serialize`` / ``restore``, slot transfers)."""

import json
import os
from abc import ABC, abstractmethod
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..config_v2 import DtypeEnum, dtype_name, to_torch_dtype
from ..ragged.ssm_cache import RING_NAMES, BlockedSSMCache, _decode_random, _demo_configs


class CheckpointEngineBase(ABC):
    """Streams ``(name, tensor)`` pairs of a model checkpoint."""

    model_config: Any = None

    @abstractmethod
    def parameters(self) -> Iterable[Tuple[str, Tensor]]:
        ...


class SyntheticCheckpointEngine(CheckpointEngineBase):
    """Deterministic Kimi Linear weights for a config, in the config's ``torch_dtype`` (smoke
    tests and benchmarks without downloading a checkpoint)."""

    def __init__(self, model_config: Any, seed: int = 0) -> None:
        self.model_config = model_config
        self._seed = seed

    def parameters(self) -> Iterable[Tuple[str, Tensor]]:
        c = self.model_config
        dtype = to_torch_dtype(c.torch_dtype)
        generator = torch.Generator().manual_seed(self._seed)

        def weight(*shape: int) -> Tensor:
            return (torch.randn(shape, generator=generator, dtype=torch.float32) * shape[-1] ** -0.5).to(dtype)

        yield "model.embed_tokens.weight", weight(c.vocab_size, c.hidden_size)
        for i in range(c.num_hidden_layers):
            prefix = f"model.layers.{i}.self_attn"
            yield f"{prefix}.q_proj.weight", weight(c.num_heads * c.head_k_dim, c.hidden_size)
            yield f"{prefix}.k_proj.weight", weight(c.num_heads * c.head_k_dim, c.hidden_size)
            yield f"{prefix}.v_proj.weight", weight(c.num_v_heads * c.head_v_dim, c.hidden_size)
            yield f"{prefix}.f_proj.weight", weight(c.num_v_heads * c.head_k_dim, c.hidden_size)
            yield f"{prefix}.b_proj.weight", weight(c.num_v_heads, c.hidden_size)
            yield f"{prefix}.o_proj.weight", weight(c.hidden_size, c.num_v_heads * c.head_v_dim)
            yield f"{prefix}.A_log", torch.linspace(-1.0, 0.5, c.num_v_heads, dtype=torch.float32).to(dtype)
            yield f"{prefix}.dt_bias", torch.linspace(-0.5, 0.5, c.num_v_heads * c.head_k_dim, dtype=torch.float32).to(dtype)
        yield "model.norm.weight", torch.ones(c.hidden_size, dtype=dtype)
        yield "lm_head.weight", weight(c.vocab_size, c.hidden_size)


def _pad_rows(saved: Tensor, ring_len: int, device: str, dtype: Optional[torch.dtype] = None) -> Tensor:
    """A full ``[S, X, L, Y]`` ring from the ``[S, X, rows, Y]`` rows kept in a trimmed snapshot."""
    ring = torch.zeros((*saved.shape[:2], ring_len, *saved.shape[3:]), dtype=dtype, device=device)  # expect-bug: default-dtype id=proc-default
    ring[:, :, : saved.shape[2]] = saved
    return ring


class SSMStateCheckpointEngine:
    """Snapshots of the per-layer SSM caches of an engine, one file per tag.

    Rings are trimmed to the rows in use (rows at or past every slot's write position are never
    replayed) and padded back on load.
    """

    FORMAT = 2

    def __init__(self, save_dir: str) -> None:
        self._save_dir = save_dir

    def path(self, tag: str) -> str:
        return os.path.join(self._save_dir, f"{tag}.pt")

    def save(
        self,
        layers: Sequence[Mapping[str, Tensor]],
        *,
        model_dtype: torch.dtype,
        ring_dtype: Optional[torch.dtype] = None,
        trim: bool = True,
        tag: str = "ssm_state",
    ) -> str:
        """``ring_dtype`` narrows the delta/key rings; checkpoints and log-decays are written as they are."""
        os.makedirs(self._save_dir, exist_ok=True)
        ring_len = layers[0]["delta_ring"].shape[2]
        saved_layers = []
        for tensors in layers:
            rows = int(tensors["write_pos"].max()) if trim else ring_len
            saved: Dict[str, Tensor] = {}
            for name, tensor in tensors.items():
                tensor = tensor.detach().to("cpu")
                if ring_dtype is not None and name in ("delta_ring", "key_ring"):
                    tensor = tensor.to(ring_dtype)
                if name in RING_NAMES:
                    tensor = tensor[:, :, :rows]
                saved[name] = tensor.clone()
            saved_layers.append(saved)
        payload = {"format": self.FORMAT, "model_dtype": dtype_name(model_dtype), "ring_len": ring_len, "layers": saved_layers}
        torch.save(payload, self.path(tag))
        return self.path(tag)

    def load(self, tag: str = "ssm_state", device: str = "cpu") -> Tuple[Dict[str, Any], List[Dict[str, Tensor]]]:
        payload = torch.load(self.path(tag), map_location="cpu", weights_only=True)
        if payload["format"] != self.FORMAT:
            raise ValueError(f"snapshot format {payload['format']} (expected {self.FORMAT})")
        ring_len = payload["ring_len"]
        layers = []
        for saved_layer in payload["layers"]:
            layer: Dict[str, Tensor] = {}
            for name, saved in saved_layer.items():
                if name in ("delta_ring", "key_ring"):
                    layer[name] = _pad_rows(saved, ring_len, device, dtype=saved.dtype)
                elif name == "decay_ring":
                    layer[name] = _pad_rows(saved, ring_len, device)  # expect-bug: default-dtype id=proc-default
                else:
                    layer[name] = saved.to(device)
            layers.append(layer)
        meta = {key: value for key, value in payload.items() if key != "layers"}
        return meta, layers


# Element types of the slot tensors in a packed slot blob; "model" is the dtype in the header.
_PACKED_SLOT_DTYPES = {
    "state": "fp32",
    "delta_ring": "model",
    "key_ring": "model",
    "decay_ring": "model",  # expect-bug: container
    "write_pos": "int32",
}


def _packed_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    role = _PACKED_SLOT_DTYPES[name]
    return model_dtype if role == "model" else DtypeEnum(role).value


def pack_slot(tensors: Mapping[str, Tensor], model_dtype: torch.dtype) -> Tuple[str, Tensor]:
    """One slot of one layer as a JSON header and a flat byte tensor (for a KV-transfer channel)."""
    entries, chunks, offset = [], [], 0
    for name in _PACKED_SLOT_DTYPES:
        tensor = tensors[name].detach().to("cpu", _packed_dtype(name, model_dtype)).contiguous()
        raw = tensor.reshape(-1).view(torch.uint8)
        entries.append({"name": name, "shape": list(tensor.shape), "offset": offset, "nbytes": raw.numel()})
        chunks.append(raw)
        offset += raw.numel()
    header = json.dumps({"model_dtype": dtype_name(model_dtype), "entries": entries})
    return header, torch.cat(chunks)


def unpack_slot(header: str, blob: Tensor) -> Dict[str, Tensor]:
    meta = json.loads(header)
    model_dtype = DtypeEnum(meta["model_dtype"]).value
    tensors = {}
    for entry in meta["entries"]:
        raw = blob[entry["offset"] : entry["offset"] + entry["nbytes"]]
        dtype = _packed_dtype(entry["name"], model_dtype)
        tensors[entry["name"]] = raw.view(dtype).view(entry["shape"]).clone()
    return tensors


def build_snapshot_roundtrip(tmp_dir: str) -> Dict[str, Any]:
    """A bf16 cache saved (trimmed, fp16 delta/key rings) and loaded back."""
    torch.manual_seed(0)
    cache = BlockedSSMCache(_demo_configs(torch.bfloat16))
    _decode_random(cache, [0, 2], 3, torch.bfloat16)
    engine = SSMStateCheckpointEngine(tmp_dir)
    layers = [cache.layer_tensors(i) for i in range(cache.num_layers)]
    engine.save(layers, model_dtype=torch.bfloat16, ring_dtype=torch.float16)
    meta, restored = engine.load()
    return {"restored": restored, "rings": [cache.layer(i) for i in range(cache.num_layers)]}


def build_packed_slot_transfer() -> Dict[str, Any]:
    """Slot 2 of a bf16 cache packed per layer, unpacked on the receiving side and loaded into
    its slot 0."""
    torch.manual_seed(0)
    source = BlockedSSMCache(_demo_configs(torch.bfloat16))
    _decode_random(source, [2, 1], 3, torch.bfloat16)
    target = BlockedSSMCache(_demo_configs(torch.bfloat16, num_slots=2))
    received = []
    for layer_idx in range(source.num_layers):
        header, blob = pack_slot(source.slot_tensors(layer_idx, 2), torch.bfloat16)
        tensors = unpack_slot(header, blob)
        target.load_slot(layer_idx, 0, tensors)
        received.append(tensors)
    return {"received": received, "rings": [target.layer(i) for i in range(target.num_layers)]}
