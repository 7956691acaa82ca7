"""GGUF-like tensor archives: a type table, a writer, a loader and an on-disk prefix-cache store.

A real GGUF file is a header, a key/value table and aligned tensor data. Here an archive is an
``.npz`` file holding each tensor's raw bytes plus one JSON record of metadata and tensor info
(``ggml_type`` and shape); ``GGUFLoader.load_tensor`` turns the bytes back into a torch tensor of the
recorded type. Only the unquantised types are supported.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

import numpy as np
import torch

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_I32 = 26
GGML_TYPE_BF16 = 30

GGML_NAMES = {
    GGML_TYPE_F32: "F32",
    GGML_TYPE_F16: "F16",
    GGML_TYPE_I32: "I32",
    GGML_TYPE_BF16: "BF16",
}
GGML_TYPE_TO_TORCH = {
    GGML_TYPE_F32: torch.float32,
    GGML_TYPE_F16: torch.float16,
    GGML_TYPE_I32: torch.int32,
    GGML_TYPE_BF16: torch.bfloat16,
}
GGML_NAME_TO_TORCH = {GGML_NAMES[ggml_type]: dtype for ggml_type, dtype in GGML_TYPE_TO_TORCH.items()}
TORCH_TO_GGML_TYPE = {dtype: ggml_type for ggml_type, dtype in GGML_TYPE_TO_TORCH.items()}

_META_KEY = "__gguf_meta__"
_TENSOR_PREFIX = "T."

# HF parameter names -> GGUF tensor names (``blk.N.*``), applied in order.
_NAME_RULES = [
    (r"^model\.embed_tokens\.", "token_embd."),
    (r"^model\.norm\.", "output_norm."),
    (r"^lm_head\.", "output."),
    (r"^model\.layers\.(\d+)\.", r"blk.\1."),
    (r"self_attn\.q_proj", "attn_q"),
    (r"self_attn\.k_proj", "attn_k"),
    (r"self_attn\.v_proj", "attn_v"),
    (r"self_attn\.f_proj", "ssm_f"),
    (r"self_attn\.b_proj", "ssm_beta"),
    (r"self_attn\.o_proj", "attn_output"),
    (r"self_attn\.A_log", "ssm_a_log"),
    (r"self_attn\.dt_bias", "ssm_dt_bias"),
    (r"input_layernorm", "attn_norm"),
    (r"post_attention_layernorm", "ffn_norm"),
    (r"mlp\.gate_proj", "ffn_gate"),
    (r"mlp\.up_proj", "ffn_up"),
    (r"mlp\.down_proj", "ffn_down"),
]


def translate_name_to_gguf(name: str) -> str:
    for pattern, replacement in _NAME_RULES:
        name = re.sub(pattern, replacement, name)
    return name


def _raw_bytes(tensor: torch.Tensor) -> np.ndarray:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().copy()


class GGUFWriter:
    """Collects key/values and tensors, then writes them as one archive."""

    def __init__(self, path: str, arch: str = "kimi_linear") -> None:
        self.path = path
        self.kv_data: dict[str, Any] = {"general.architecture": arch}
        self.tensors: dict[str, tuple[int, tuple[int, ...], np.ndarray]] = {}

    def add_key_value(self, key: str, value: Any) -> None:
        self.kv_data[key] = value

    def add_tensor(self, name: str, tensor: torch.Tensor, raw_dtype: Optional[int] = None) -> None:
        """Stores ``tensor`` as ``raw_dtype`` (a ``GGML_TYPE_*``; default: its own dtype)."""
        ggml_type = TORCH_TO_GGML_TYPE[tensor.dtype] if raw_dtype is None else raw_dtype
        data = tensor.detach().to(GGML_TYPE_TO_TORCH[ggml_type])
        self.tensors[name] = (ggml_type, tuple(data.shape), _raw_bytes(data))

    def write_to_file(self) -> None:
        info = {name: {"ggml_type": t, "shape": list(shape)} for name, (t, shape, _) in self.tensors.items()}
        header = json.dumps({"kv": self.kv_data, "tensors": info}).encode()
        arrays = {_TENSOR_PREFIX + name: raw for name, (_, _, raw) in self.tensors.items()}
        with open(self.path, "wb") as handle:
            np.savez(handle, **{_META_KEY: np.frombuffer(header, dtype=np.uint8)}, **arrays)


class GGUFLoader:
    """Reads an archive written by ``GGUFWriter``; tensors come back in their stored ggml type."""

    def __init__(self, gguf_path: str) -> None:
        self.gguf_path = gguf_path
        with np.load(gguf_path) as archive:
            header = json.loads(archive[_META_KEY].tobytes())
            self._raw = {
                key[len(_TENSOR_PREFIX) :]: archive[key] for key in archive.files if key.startswith(_TENSOR_PREFIX)
            }
        self.gguf_file_meta: dict[str, Any] = header["kv"]
        self.tensor_info: dict[str, dict[str, Any]] = header["tensors"]

    def has_tensor(self, name: str) -> bool:
        return translate_name_to_gguf(name) in self.tensor_info

    def get_ggml_type(self, name: str) -> int:
        return self.tensor_info[translate_name_to_gguf(name)]["ggml_type"]

    def load_tensor(self, name: str, device: str = "cpu", target_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        name = translate_name_to_gguf(name)
        info = self.tensor_info[name]
        dtype = GGML_TYPE_TO_TORCH[info["ggml_type"]]
        tensor = torch.frombuffer(bytearray(self._raw[name].tobytes()), dtype=dtype).reshape(info["shape"])
        if target_dtype is not None:
            tensor = tensor.to(target_dtype)
        return tensor.to(device)


def write_gguf_from_state_dict(path: str, state_dict: dict[str, torch.Tensor], file_type: int) -> None:
    """Converts an HF state dict: matrices and norms to ``file_type``, the gate parameters to F32."""
    writer = GGUFWriter(path)
    writer.add_key_value("general.file_type", GGML_NAMES[file_type])
    for name, tensor in state_dict.items():
        gguf_name = translate_name_to_gguf(name)
        keep_f32 = gguf_name.endswith(("ssm_a_log", "ssm_dt_bias"))
        writer.add_tensor(gguf_name, tensor, GGML_TYPE_F32 if keep_f32 else file_type)
    writer.write_to_file()


class DiskPrefixStore:
    """Prefix-cache blocks on disk (KVC2-like): one raw file per (prefix, ring, layer).

    Blocks are written in ``storage_type`` (F16 unless told otherwise) to halve disk traffic;
    ``read_block`` hands back the raw bytes and shape, and the reader decides the dtype it restores to.
    """

    def __init__(self, root: str, storage_type: int = GGML_TYPE_F16) -> None:
        self.root = root
        self.storage_type = storage_type
        self.index: dict[str, list[int]] = {}
        os.makedirs(root, exist_ok=True)

    @property
    def storage_torch_dtype(self) -> torch.dtype:
        return GGML_TYPE_TO_TORCH[self.storage_type]

    def _path(self, prefix: str, ring: str, layer_idx: int) -> str:
        return os.path.join(self.root, f"{prefix}.{ring}.{layer_idx}.bin")

    def write_block(self, prefix: str, ring: str, layer_idx: int, tensor: torch.Tensor) -> None:
        data = tensor.detach().to(self.storage_torch_dtype)
        with open(self._path(prefix, ring, layer_idx), "wb") as handle:
            handle.write(_raw_bytes(data).tobytes())
        self.index[f"{prefix}.{ring}.{layer_idx}"] = list(data.shape)

    def read_block(self, prefix: str, ring: str, layer_idx: int) -> tuple[bytearray, list[int]]:
        with open(self._path(prefix, ring, layer_idx), "rb") as handle:
            blob = bytearray(handle.read())
        return blob, self.index[f"{prefix}.{ring}.{layer_idx}"]


def build_prefix_store_roundtrip(tmp_dir: str):
    """A decoded cache written to a prefix store, and a second cache refilled from it in place."""
    from ..models.configuration_kimi_linear import KimiLinearConfig
    from ..models.custom_cache import KDAStaticCache
    from ..operators.kda import random_decode_batch

    torch.manual_seed(13)
    config = KimiLinearConfig(num_hidden_layers=1)
    source = KDAStaticCache(config, max_batch_size=2)
    slot_ids = torch.tensor([0, 1], dtype=torch.int32)
    for _ in range(2):
        batch = random_decode_batch(config, 2, config.model_torch_dtype)
        source.step(0, slot_ids=slot_ids, **batch)
        source.advance(slot_ids)
    store = DiskPrefixStore(os.path.join(tmp_dir, "prefix"))
    source.write_prefix(store, "p0")

    target = KDAStaticCache(config, max_batch_size=2)
    target.restore_prefix(store, "p0")

    # Snapshot of the log-decay rings as a plain .npz, read back and widened to float32.
    snapshot = os.path.join(tmp_dir, "alpha_log.npz")
    np.savez(snapshot, ring0=target.alpha_log_cache[0].numpy())
    with np.load(snapshot) as archive:
        alpha_log_snapshot = torch.from_numpy(archive["ring0"]).float()
    gate_dtype = GGML_NAME_TO_TORCH["F32"]
    alpha_log_spare = torch.zeros(config.ring_shapes(2)["alpha_log"], dtype=gate_dtype)
    return {"source": source, "target": target, "alpha_log_snapshot": alpha_log_snapshot, "alpha_log_spare": alpha_log_spare}
