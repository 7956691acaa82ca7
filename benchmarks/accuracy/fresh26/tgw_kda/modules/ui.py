"""The settings layer behind the interface: element lists, interface state, settings files.

Settings files are the small YAML subset the UI writes itself: ``key: value`` lines with
strings, numbers, booleans and ``null``, and lists written as ``- item`` lines under their key.
"""

import copy
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from tgw_kda.modules import loaders, shared, utils
from tgw_kda.modules.text_generation import ChatDecodeState, ChatRingSpec, feed_chat_state, new_chat_state

logger = logging.getLogger(__name__)


def list_model_elements() -> List[str]:
    """Interface elements of the Model tab, named after the command-line flags they set."""
    elements = ["filter_by_loader", "loader"] + loaders.get_all_params()
    return elements + ["sessions_dir", "max_slots", "ring_len"]


def list_interface_input_elements() -> List[str]:
    elements = [
        "max_new_tokens",
        "auto_max_new_tokens",
        "seed",
        "truncation_length",
        "custom_stopping_strings",
        "ban_eos_token",
        "add_bos_token",
        "skip_special_tokens",
        "stream",
        "keep_chat_state",
        "session_format",
        "half_precision_sessions",
        "alpha_ring_dtype",
        "precision",
        "mode",
        "character",
        "name1",
        "unique_id",
    ]
    return elements + list_model_elements()


def gather_interface_values(*values: Any) -> Dict[str, Any]:
    """The interface state dict from the values of the elements, in element order."""
    names = list_interface_input_elements()
    state = {name: value for name, value in zip(names, values)}
    for name in names[len(values):]:
        state[name] = shared.settings.get(name, getattr(shared.args, name, None))
    return state


def apply_interface_values(state: Dict[str, Any], use_persistent: bool = False) -> List[Any]:
    """Element values for ``state`` (or the persistent settings), in element order."""
    source = shared.settings if use_persistent else state
    return [source.get(name, shared.settings.get(name)) for name in list_interface_input_elements()]


def _parse_scalar(text: str) -> Any:
    text = text.strip()
    if text in ("null", "~", ""):
        return None
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_settings_text(text: str) -> Dict[str, Any]:
    """Reads a settings file written by :func:`dump_settings_text` (or by hand)."""
    settings: Dict[str, Any] = {}
    current: Optional[str] = None
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.lstrip().startswith("- ") and current is not None:
            settings.setdefault(current, [])
            if settings[current] is None:
                settings[current] = []
            settings[current].append(_parse_scalar(line.lstrip()[2:]))
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"cannot read settings line {raw!r}")
        current = key.strip()
        settings[current] = [] if value.strip() == "" else _parse_scalar(value)
    return settings


def _dump_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if text == "" or text.strip() != text or ":" in text or text in ("true", "false", "null"):
        return repr(text)
    return text


def dump_settings_text(settings: Dict[str, Any]) -> str:
    lines = []
    for key, value in settings.items():
        if isinstance(value, list):
            lines.append(f"{key}:")
            lines.extend(f"  - {_dump_scalar(item)}" for item in value)
        else:
            lines.append(f"{key}: {_dump_scalar(value)}")
    return "\n".join(lines) + "\n"


def load_settings(path: Path) -> Dict[str, Any]:
    """Merges the settings file at ``path`` into ``shared.settings``."""
    new_settings = parse_settings_text(Path(path).read_text(encoding="utf-8"))
    unknown = [key for key in new_settings if key not in shared.settings and "-" not in key]
    if unknown:
        logger.warning("Ignoring unknown settings: %s", ", ".join(unknown))
    for key, value in new_settings.items():
        if key not in unknown:
            shared.settings[key] = value
    return new_settings


def save_settings(state: Dict[str, Any], extensions_list: List[str], show_controls: bool) -> str:
    """The settings file for the current interface state (only what differs from the defaults)."""
    output = copy.deepcopy(shared.settings)
    for key in list(output):
        if key in state and state[key] is not None:
            output[key] = state[key]
    output["default_extensions"] = list(extensions_list)
    output["show_controls"] = show_controls
    changed = {key: value for key, value in output.items() if shared.default_settings.get(key) != value}
    return dump_settings_text(changed)


_PRECISION_METHODS = {"float32": "float", "float16": "half", "bfloat16": "bfloat16"}


def apply_precision(precision: str) -> str:
    """The "precision" dropdown: converts the loaded Transformers model in place."""
    if shared.model is None:
        return "No model is loaded."
    if precision == "auto":
        return "Keeping the precision the model was loaded with."
    method = _PRECISION_METHODS[precision]
    shared.model = getattr(shared.model, method)()  # expect-bug: module-cast
    shared.args.bf16 = precision == "bfloat16"
    shared.args.cpu = shared.args.cpu and precision == "float32"
    shared.settings["precision"] = precision
    return f"Converted the model to {precision}."


def chat_state_from_settings(unique_id: str) -> ChatDecodeState:
    """A new chat state for the loaded model, with the ring dtype the settings name."""
    model = shared.model if not hasattr(shared.model, "model") else shared.model.model
    dtype = model.dtype
    spec = ChatRingSpec(
        delta_dtype=dtype,
        key_dtype=dtype,
        alpha_dtype=utils.str_to_torch_dtype(shared.settings["alpha_ring_dtype"]),
    )
    chat = new_chat_state(unique_id, model.config, spec)
    shared.chat_states[unique_id] = chat
    return chat


def build_settings_roundtrip(tmp_dir: str) -> Dict[str, Any]:
    """A settings file saved from the interface and loaded back, then a chat opened under it."""
    from tgw_kda.modules.kda_model import KimiLinearConfig, KimiLinearForCausalLM

    with shared.scoped_state():
        state = gather_interface_values(24, False, 0)
        state.update(alpha_ring_dtype="float32", session_format="npz", keep_chat_state=True)
        path = Path(tmp_dir) / "settings.yaml"
        path.write_text(save_settings(state, ["session_swap"], show_controls=False), encoding="utf-8")
        shared.settings = copy.deepcopy(shared.default_settings)
        loaded = load_settings(path)
        torch.manual_seed(0)
        shared.model = KimiLinearForCausalLM(KimiLinearConfig(), dtype=torch.bfloat16)
        chat = chat_state_from_settings("tab-1")
        feed_chat_state(chat, [4, 8, 12, 16, 20], shared.model)
        return {"chat": chat, "max_new_tokens": loaded["max_new_tokens"], "format": loaded["session_format"]}


def build_precision_switch(tmp_dir: str) -> Any:
    """Transformers loader on --cpu with two slots, switched to bfloat16 from the dropdown."""
    from tgw_kda.modules import models
    from tgw_kda.modules.kda_model import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_dir, "kimi-linear-tiny")
    with shared.scoped_state(cpu=True, max_slots=2, model_dir=tmp_dir):
        models.load_model("kimi-linear-tiny", "Transformers")
        slots = torch.tensor([0, 1], dtype=torch.int32)
        with torch.no_grad():
            shared.model.decode_step(torch.tensor([3, 4]), slots, shared.model.slot_views())
            apply_precision("bfloat16")
            shared.model.decode_step(torch.tensor([5, 6]), slots, shared.model.slot_views())
        return shared.model
