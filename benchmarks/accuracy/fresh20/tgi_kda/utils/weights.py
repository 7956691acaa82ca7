import os
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Union

import torch

# Checkpoints are torch files holding {"tensors": {name: tensor}, "metadata": {...}}, laid out
# like safetensors shards: one name lives in exactly one file.


def save_file(
    tensors: Dict[str, torch.Tensor],
    filename: Union[str, os.PathLike],
    metadata: Optional[Dict[str, str]] = None,
):
    payload = {
        "tensors": {name: tensor.detach().contiguous() for name, tensor in tensors.items()},
        "metadata": dict(metadata or {}),
    }
    torch.save(payload, filename)


def load_file(filename: Union[str, os.PathLike]) -> Dict[str, torch.Tensor]:
    return torch.load(filename, map_location="cpu", weights_only=True)["tensors"]


class Weights:
    def __init__(
        self,
        filenames: List[Path],
        device,
        dtype,
        process_group,
        aliases: Optional[Dict[str, List[str]]] = None,
        prefix: Optional[str] = None,
    ):
        routing = {}
        for filename in filenames:
            for k in load_file(filename).keys():
                if k in routing:
                    raise RuntimeError(
                        f"Key {k} was found in multiple files: {filename} and {routing[k]}"
                    )
                routing[k] = filename
        if aliases is None:
            aliases = {}
        self.aliases = aliases
        self.routing = routing
        self.device = device
        self.dtype = dtype
        self.process_group = process_group
        self.prefix = prefix
        self._handles = {}

    def _get_handle(self, filename):
        if filename not in self._handles:
            self._handles[filename] = load_file(filename)

        return self._handles[filename]

    def get_filename(self, tensor_name: str) -> (str, str):
        names = [tensor_name]
        if self.prefix is not None:
            prefixed = f"{self.prefix}.{tensor_name}"
            names.append(prefixed)
        for name in names:
            filename = self.routing.get(name, None)
            if filename is not None:
                return str(filename), name

            aliases = self.aliases.get(name, [])
            for alias in aliases:
                filename = self.routing.get(alias, None)
                if filename is not None:
                    return str(filename), alias
        raise RuntimeError(f"weight {tensor_name} does not exist")

    def _get_slice(self, tensor_name: str):
        filename, tensor_name = self.get_filename(tensor_name)
        f = self._get_handle(filename)
        return f[tensor_name]

    def has_tensor(self, tensor_name: str):
        try:
            self.get_filename(tensor_name)
        except Exception:
            return False
        return True

    def get_shape(self, tensor_name: str):
        return self._get_slice(tensor_name).shape

    def get_tensor(self, tensor_name: str, to_device=True, to_dtype=True):
        tensor = self._get_slice(tensor_name)
        # Integer tensors (indices, counters) keep their dtype.
        if tensor.dtype not in [torch.int16, torch.int32, torch.int64] and to_dtype:
            tensor = tensor.to(dtype=self.dtype)
        if to_device:
            tensor = tensor.to(device=self.device)
        return tensor

    def get_partial_sharded(
        self, tensor_name: str, dim: int, to_device=True, to_dtype=True
    ):
        world_size = self.process_group.size()
        rank = self.process_group.rank()

        slice_ = self._get_slice(tensor_name)
        size = slice_.shape[dim]
        block_size = (size + world_size - 1) // world_size
        start = rank * block_size
        stop = (rank + 1) * block_size

        tensor = slice_.narrow(dim, start, min(stop, size) - start).clone()
        if tensor.dtype not in [torch.int16, torch.int32, torch.int64] and to_dtype:
            tensor = tensor.to(dtype=self.dtype)
        if to_device:
            tensor = tensor.to(device=self.device)
        return tensor

    def get_sharded(self, tensor_name: str, dim: int, to_device=True, to_dtype=True):
        slice_ = self._get_slice(tensor_name)
        world_size = self.process_group.size()
        size = slice_.shape[dim]
        assert (
            size % world_size == 0
        ), f"The choosen size {size} is not compatible with sharding on {world_size} shards"
        return self.get_partial_sharded(
            tensor_name, dim, to_device=to_device, to_dtype=to_dtype
        )

    def get_multi_weights_col(self, prefixes: List[str], dim: int):
        weights = [self.get_sharded(f"{p}.weight", dim=0) for p in prefixes]
        return torch.cat(weights, dim=dim)

    def get_multi_weights_row(self, prefix: str):
        return self.get_sharded(f"{prefix}.weight", dim=1)


def build_sharded_replay_weights():
    """Reads a KDA layer's gate parameters and a saved gate ring back from a shard."""
    from .dist import FakeGroup

    torch.manual_seed(0)
    heads, head_dim, ring_len = 2, 4, 4
    tensors = {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(heads * head_dim, 16),
        "model.layers.0.self_attn.A_log": torch.log(torch.rand(heads) * 15 + 1),
        "model.layers.0.self_attn.dt_bias": torch.randn(heads * head_dim) * 0.1,
        "model.layers.0.self_attn.replay.decay_ring": -torch.rand(1, heads, ring_len, head_dim),
        "model.layers.0.self_attn.replay.write_pos": torch.tensor([2], dtype=torch.int32),
    }
    with tempfile.TemporaryDirectory() as folder:
        filename = Path(folder) / "model-00001-of-00001.pt"
        save_file(tensors, filename, metadata={"format": "pt"})
        weights = Weights([filename], torch.device("cpu"), torch.bfloat16, FakeGroup(0, 1))
        prefix = "model.layers.0.self_attn"
        return {
            "q_proj": weights.get_sharded(f"{prefix}.q_proj.weight", dim=0),
            "A_log": weights.get_sharded(f"{prefix}.A_log", dim=0, to_dtype=False),
            "dt_bias": weights.get_sharded(f"{prefix}.dt_bias", dim=0, to_dtype=False),
            "decay_ring": weights.get_tensor(f"{prefix}.replay.decay_ring", to_dtype=False),
            "write_pos": weights.get_tensor(f"{prefix}.replay.write_pos"),
        }
