"""Session swap: keeps the decode states of the most recent chats in memory, the rest on disk.

Every open chat holds rings for every layer. With many tabs open that adds up, so after each
reply the least recently used chats beyond ``max_resident`` are pickled to ``swap_dir`` and
dropped; opening one of them again swaps it back in. A chat that was never seen gets empty
rings laid out like a resident chat's, without asking the model.
"""

import logging
import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from tgw_kda.modules import extensions, shared
from tgw_kda.modules.text_generation import RING_FIELDS, ChatDecodeState

logger = logging.getLogger(__name__)

params = {
    "display_name": "Session swap",
    "is_tab": False,
    "max_resident": 2,
    "swap_dir": "logs/swap",
}

_recent: "OrderedDict[str, None]" = OrderedDict()
_swapped: Dict[str, Path] = {}


def setup() -> None:
    Path(params["swap_dir"]).mkdir(parents=True, exist_ok=True)


def teardown() -> None:
    _recent.clear()
    _swapped.clear()


def _swap_path(unique_id: str) -> Path:
    return Path(params["swap_dir"]) / f"{unique_id}.swap"


def swap_out(chat: ChatDecodeState) -> Path:
    """Writes ``chat`` to the swap folder (numpy has no bfloat16: floats go as float16)."""
    arrays: Dict[str, np.ndarray] = {}
    for name in RING_FIELDS:
        for i, tensor in enumerate(getattr(chat, name)):
            tensor = tensor.detach().cpu()
            arrays[f"{name}/{i}"] = (tensor.to(torch.float16) if tensor.is_floating_point() else tensor).numpy()  # expect-bug: load id=swap-fp16
    path = _swap_path(chat.unique_id)
    with open(path, "wb") as f:
        pickle.dump({"unique_id": chat.unique_id, "n_tokens": chat.n_tokens, "arrays": arrays}, f, protocol=pickle.HIGHEST_PROTOCOL)
    _swapped[chat.unique_id] = path
    return path


def swap_in(unique_id: str, compute_dtype: torch.dtype) -> ChatDecodeState:
    """Reads a swapped chat back; the delta and key rings return to ``compute_dtype``."""
    with open(_swapped.pop(unique_id), "rb") as f:
        payload = pickle.load(f)
    rings: Dict[str, List[torch.Tensor]] = {name: [] for name in RING_FIELDS}
    for key, array in payload["arrays"].items():
        name, _, _ = key.partition("/")
        tensor = torch.from_numpy(array)
        if name in ("delta_ring", "key_ring"):
            tensor = tensor.to(compute_dtype)
        rings[name].append(tensor)  # expect-bug: load id=swap-fp16
    return ChatDecodeState(payload["unique_id"], n_tokens=payload["n_tokens"], **rings)


def fresh_like(template: ChatDecodeState, unique_id: str) -> ChatDecodeState:
    """Empty rings for ``unique_id`` with the layout and dtypes of ``template``."""
    chat = ChatDecodeState(unique_id)
    for i in range(template.num_layers):
        delta = template.delta_ring[i]
        chat.state.append(torch.zeros_like(template.state[i]))
        chat.delta_ring.append(torch.zeros_like(delta))
        chat.key_ring.append(torch.zeros_like(template.key_ring[i]))
        chat.alpha_ring.append(delta.new_zeros(template.alpha_ring[i].shape))  # expect-bug: like
        chat.write_pos.append(torch.zeros_like(template.write_pos[i]))
    return chat


def _resident_template() -> Optional[ChatDecodeState]:
    return next(iter(shared.chat_states.values()), None)


def ensure_chat_state(unique_id: str) -> ChatDecodeState:
    """Replaces ``text_generation._ensure_chat_state``: swap in, reuse a layout, or create."""
    chat = shared.chat_states.get(unique_id)
    if chat is None and unique_id in _swapped:
        template = _resident_template()
        dtype = template.delta_ring[0].dtype if template is not None else torch.float16
        chat = swap_in(unique_id, dtype)
    elif chat is None and _resident_template() is not None:
        chat = fresh_like(_resident_template(), unique_id)
    elif chat is None:
        chat = extensions.original("tgw_kda.modules.text_generation:_ensure_chat_state")(unique_id)
    shared.chat_states[unique_id] = chat
    _recent.pop(unique_id, None)
    _recent[unique_id] = None
    return chat


def chat_state_updated(chat: ChatDecodeState) -> None:
    """After a reply: swap out the least recently used chats beyond ``max_resident``."""
    _recent.pop(chat.unique_id, None)
    _recent[chat.unique_id] = None
    while len(_recent) > params["max_resident"]:
        unique_id, _ = _recent.popitem(last=False)
        victim = shared.chat_states.pop(unique_id, None)
        if victim is not None:
            swap_out(victim)


patches = {"tgw_kda.modules.text_generation:_ensure_chat_state": ensure_chat_state}


def build_swap_cycle(tmp_dir: str) -> Dict[str, Any]:
    """Three bf16 chats with one resident slot: the first is swapped out and back in, and a
    fourth, new chat gets rings laid out like the resident one."""
    from tgw_kda.modules import text_generation
    from tgw_kda.modules.kda_model import KimiLinearConfig, KimiLinearForCausalLM

    saved = dict(params)
    params.update(swap_dir=tmp_dir, max_resident=1)
    with shared.scoped_state():
        extensions.load_extensions(["session_swap"])
        try:
            torch.manual_seed(0)
            model = KimiLinearForCausalLM(KimiLinearConfig(), dtype=torch.bfloat16)
            for unique_id, prompt in (("a", [3, 4, 5]), ("b", [6, 7])):
                chat = text_generation.new_chat_state(unique_id, model.config, text_generation.ChatRingSpec.for_dtype(torch.bfloat16))
                shared.chat_states[unique_id] = chat
                text_generation.feed_chat_state(chat, prompt, model)
                extensions.apply_extensions("chat_state_updated", chat)
            resumed = text_generation._ensure_chat_state("a")
            text_generation.feed_chat_state(resumed, [8], model)
            fresh = text_generation._ensure_chat_state("c")
            text_generation.feed_chat_state(fresh, [9, 10], model)
            return {"resumed": resumed, "fresh": fresh}
        finally:
            extensions.unload_extensions(["session_swap"])
            params.clear()
            params.update(saved)
