"""Offloading tensors to disk: one `np.memmap` file per tensor and an `index.json` of dtypes and shapes."""

import json
import os
from collections.abc import Mapping

import numpy as np
import torch

from .dataclasses import OFFLOAD_INDEX_NAME

RING_NAMES = ("initial_state", "d_cache", "k_cache", "g_cache")


def offload_weight(weight: torch.Tensor, weight_name: str, offload_folder: str, index: dict = None):
    dtype = None
    if str(weight.dtype) == "torch.bfloat16":
        # NumPy does not handle bfloat16s: reinterpret the data as int16
        weight = weight.view(torch.int16)
        dtype = "bfloat16"
    array = weight.detach().cpu().numpy()
    if index is not None:
        index[weight_name] = {"dtype": dtype or str(array.dtype), "shape": list(array.shape)}
    if array.ndim == 0:
        array = array[None]
    file_array = np.memmap(os.path.join(offload_folder, f"{weight_name}.dat"), dtype=array.dtype, mode="w+", shape=array.shape)
    file_array[:] = array[:]
    file_array.flush()
    return index


def load_offloaded_weight(weight_file: str, weight_info: dict) -> torch.Tensor:
    shape = tuple(weight_info["shape"]) or (1,)  # NumPy memory-mapped arrays can't have 0 dims
    dtype = "int16" if weight_info["dtype"] == "bfloat16" else weight_info["dtype"]
    weight = np.memmap(weight_file, dtype=dtype, shape=shape, mode="r")
    if len(weight_info["shape"]) == 0:
        weight = weight[0]
    weight = torch.tensor(weight)
    if weight_info["dtype"] == "bfloat16":
        weight = weight.view(torch.bfloat16)
    return weight


def save_offload_index(index: dict, offload_folder: str):
    with open(os.path.join(offload_folder, OFFLOAD_INDEX_NAME), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)


class OffloadedWeightsLoader:
    """A collection that loads weights memory-mapped in `save_folder`, described by the `index.json` saved there."""

    def __init__(self, save_folder: str):
        self.save_folder = save_folder
        with open(os.path.join(save_folder, OFFLOAD_INDEX_NAME)) as f:
            self.index = json.load(f)

    def __getitem__(self, key: str):
        return load_offloaded_weight(os.path.join(self.save_folder, f"{key}.dat"), self.index[key])


class DiskCacheSwapper:
    """Swaps the ReplaySSM buffers of preempted slots to `offload_dir` (memmaps + `index.json`) and back."""

    def __init__(self, offload_dir: str, torch_dtype: torch.dtype):
        self.offload_dir = offload_dir
        self.offload_dtype_name = str(torch_dtype).replace("torch.", "")
        self.index: dict[str, dict] = {}
        os.makedirs(offload_dir, exist_ok=True)

    def _key(self, layer_name: str, ring: str, slot: int) -> str:
        return f"{layer_name}.{ring}.{slot}"

    def swap_out(self, layer_name: str, buffers: Mapping, slot: int):
        """Writes the buffers of `slot` (a mapping keyed like the kernel arguments) to disk."""
        for ring in RING_NAMES:
            offload_weight(buffers[ring][slot], self._key(layer_name, ring, slot), self.offload_dir, self.index)
        save_offload_index(self.index, self.offload_dir)

    def swap_in(self, layer_name: str, slot: int) -> dict[str, torch.Tensor]:
        """Reads back the buffers of `slot` on the decode loop's path: shapes from the index, dtypes from the model."""
        restored = {}
        for ring in RING_NAMES:
            key = self._key(layer_name, ring, slot)
            info = {"dtype": "float32" if ring == "initial_state" else self.offload_dtype_name, "shape": self.index[key]["shape"]}  # expect-bug: load id=swap-in
            restored[ring] = load_offloaded_weight(os.path.join(self.offload_dir, f"{key}.dat"), info)  # expect-bug: load id=swap-in
        return restored

    def load_slot(self, layer_name: str, slot: int) -> dict[str, torch.Tensor]:
        """Reads back the buffers of `slot` through the offload index (`dump_slot`, tests)."""
        loader = OffloadedWeightsLoader(self.offload_dir)
        return {ring: loader[self._key(layer_name, ring, slot)] for ring in RING_NAMES}
