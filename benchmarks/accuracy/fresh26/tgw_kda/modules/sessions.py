"""Saving and loading chat decode states (the Session tab's "Save state"/"Load state").

A saved state lets a long chat continue after a restart without re-reading its history. Three
formats, chosen by ``settings["session_format"]`` or the file suffix:

* ``.pt``: ``torch.save`` of ``{"meta": ..., "tensors": {...}}``; with
  ``settings["half_precision_sessions"]`` the floating tensors are stored in the model dtype;
* ``.npz``: numpy arrays; bfloat16 rings (which numpy cannot hold) are stored as their int16 bit
  patterns and tagged in the metadata;
* ``.kdastate``: raw tensor bytes after a JSON header (``utils.write_raw_tensors``).
"""

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from tgw_kda.modules import shared, utils
from tgw_kda.modules.kda_model import KimiLinearConfig, KimiLinearForCausalLM
from tgw_kda.modules.text_generation import (
    RING_FIELDS,
    ChatDecodeState,
    ChatRingSpec,
    feed_chat_state,
    new_chat_state,
)

logger = logging.getLogger(__name__)

SUFFIXES = {"pt": ".pt", "npz": ".npz", "raw": ".kdastate"}


def session_path(unique_id: str, fmt: Optional[str] = None) -> Path:
    fmt = fmt or shared.settings["session_format"]
    return Path(shared.args.sessions_dir) / f"{unique_id}{SUFFIXES[fmt]}"


def _meta(chat: ChatDecodeState, dtype: Optional[torch.dtype] = None) -> Dict[str, Any]:
    return {
        "unique_id": chat.unique_id,
        "n_tokens": chat.n_tokens,
        "layers": chat.num_layers,
        "dtype": utils.dtype_to_str(dtype or chat.delta_ring[0].dtype),
    }


def _flat_tensors(chat: ChatDecodeState, dtype: Optional[torch.dtype] = None) -> Dict[str, torch.Tensor]:
    """``{"alpha_ring.0": ..., ...}``; floating tensors cast to ``dtype`` when one is given."""
    tensors = {}
    for name in RING_FIELDS:
        for i, tensor in enumerate(getattr(chat, name)):
            tensor = tensor.detach().cpu()
            tensors[f"{name}.{i}"] = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor  # expect-bug: load id=half-sessions
    return tensors


# --- .pt -------------------------------------------------------------------------------------


def save_chat_state_pt(chat: ChatDecodeState, path: Path) -> Path:
    dtype = chat.delta_ring[0].dtype if shared.settings["half_precision_sessions"] else None
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"meta": _meta(chat), "tensors": _flat_tensors(chat, dtype)}, path)
    return path


def load_chat_state_pt(path: Path) -> ChatDecodeState:
    payload = torch.load(path, map_location="cpu", weights_only=True)
    meta, tensors = payload["meta"], payload["tensors"]
    rings = {name: [tensors[f"{name}.{i}"] for i in range(meta["layers"])] for name in RING_FIELDS}  # expect-bug: load id=half-sessions
    return ChatDecodeState(meta["unique_id"], n_tokens=meta["n_tokens"], **rings)


def resume_chat_state_pt(path: Path, chat: ChatDecodeState) -> ChatDecodeState:
    """Loads a ``.pt`` state into the already allocated rings of ``chat`` (they keep their dtypes)."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    for key, tensor in payload["tensors"].items():
        name, _, index = key.rpartition(".")
        getattr(chat, name)[int(index)].copy_(tensor)
    chat.n_tokens = payload["meta"]["n_tokens"]
    return chat


# --- .npz ------------------------------------------------------------------------------------


def save_chat_state_npz(chat: ChatDecodeState, path: Path) -> Path:
    arrays: Dict[str, np.ndarray] = {}
    bf16: List[str] = []
    for key, tensor in _flat_tensors(chat).items():
        if tensor.dtype == torch.bfloat16:
            arrays[key] = tensor.view(torch.int16).numpy()
            bf16.append(key)
        else:
            arrays[key] = tensor.numpy()
    meta = dict(_meta(chat), bf16=bf16)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8), **arrays)
    return path


def load_chat_state_npz(path: Path) -> ChatDecodeState:
    with np.load(path) as data:
        meta = json.loads(bytes(data["__meta__"]).decode("utf-8"))
        rings: Dict[str, List[torch.Tensor]] = {name: [] for name in RING_FIELDS}
        for name in RING_FIELDS:
            for i in range(meta["layers"]):
                key = f"{name}.{i}"
                tensor = torch.from_numpy(data[key].copy())
                rings[name].append(tensor.view(torch.bfloat16) if key in meta["bf16"] else tensor)
    return ChatDecodeState(meta["unique_id"], n_tokens=meta["n_tokens"], **rings)


# --- raw -------------------------------------------------------------------------------------


def save_chat_state_raw(chat: ChatDecodeState, path: Path) -> Path:
    utils.write_raw_tensors(path, _flat_tensors(chat), metadata=_meta(chat))
    return path


def _blank_chat(meta: Dict[str, str], tensors: Dict[str, torch.Tensor]) -> ChatDecodeState:
    """Empty rings shaped like the file's tensors, in the dtype the file was saved from."""
    layers = int(meta["layers"])
    factory = {"dtype": utils.str_to_torch_dtype(meta["dtype"]), "device": "cpu"}
    delta_ring, key_ring, alpha_ring = ([torch.zeros(tensors[f"{name}.{i}"].shape, **factory) for i in range(layers)] for name in ("delta_ring", "key_ring", "alpha_ring"))  # expect-bug: pool-dtype
    state = [torch.zeros(tensors[f"state.{i}"].shape, dtype=torch.float32) for i in range(layers)]
    write_pos = [torch.zeros(tensors[f"write_pos.{i}"].shape, dtype=torch.int32) for i in range(layers)]
    return ChatDecodeState(meta["unique_id"], state, delta_ring, key_ring, alpha_ring, write_pos)


def load_chat_state_raw(path: Path, into: Optional[ChatDecodeState] = None) -> ChatDecodeState:
    """Loads a raw state into ``into``, or into fresh rings."""
    tensors, meta = utils.read_raw_tensors(path)
    chat = into if into is not None else _blank_chat(meta, tensors)
    for key, tensor in tensors.items():
        name, _, index = key.rpartition(".")
        getattr(chat, name)[int(index)].copy_(tensor)
    chat.n_tokens = int(meta["n_tokens"])
    return chat


# --- dispatch --------------------------------------------------------------------------------


def save_chat_state(chat: ChatDecodeState, fmt: Optional[str] = None) -> Path:
    fmt = fmt or shared.settings["session_format"]
    path = session_path(chat.unique_id, fmt)
    saver = {"pt": save_chat_state_pt, "npz": save_chat_state_npz, "raw": save_chat_state_raw}[fmt]
    logger.info("Saving the chat state of %s to %s", chat.unique_id, path)
    return saver(chat, path)


def load_chat_state(path: Path) -> ChatDecodeState:
    path = Path(path)
    loaders = {".pt": load_chat_state_pt, ".npz": load_chat_state_npz, ".kdastate": load_chat_state_raw}
    chat = loaders[path.suffix](path)
    shared.chat_states[chat.unique_id] = chat
    return chat


def _fed_chat(unique_id: str, dtype: torch.dtype) -> ChatDecodeState:
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(KimiLinearConfig(), dtype=dtype)
    chat = new_chat_state(unique_id, model.config, ChatRingSpec.for_dtype(dtype))
    feed_chat_state(chat, [3, 4, 5, 6, 7, 8, 9], model)
    return chat


def build_session_roundtrips(tmp_dir: str) -> Dict[str, ChatDecodeState]:
    """A bf16 chat saved in full precision and reloaded through each format."""
    with shared.scoped_state(sessions_dir=tmp_dir):
        chat = _fed_chat("roundtrip", torch.bfloat16)
        pt = load_chat_state(save_chat_state(chat, "pt"))
        npz = load_chat_state(save_chat_state(chat, "npz"))
        raw_path = save_chat_state(chat, "raw")
        resumed = load_chat_state_raw(raw_path, into=_fed_chat("open-tab", torch.bfloat16))
        pt_resumed = resume_chat_state_pt(session_path("roundtrip", "pt"), _fed_chat("open-tab-2", torch.bfloat16))
        return {"pt": pt, "npz": npz, "raw_into_open_chat": resumed, "pt_into_open_chat": pt_resumed}


def build_session_reloads(tmp_dir: str) -> Dict[str, ChatDecodeState]:
    """A bf16 chat saved with half-precision sessions (.pt) and as a raw file, both reloaded."""
    with shared.scoped_state(sessions_dir=tmp_dir):
        shared.settings["half_precision_sessions"] = True
        chat = _fed_chat("reload", torch.bfloat16)
        half = load_chat_state(save_chat_state(chat, "pt"))
        raw = load_chat_state(save_chat_state(chat, "raw"))
        return {"half_pt": half, "raw": raw}
