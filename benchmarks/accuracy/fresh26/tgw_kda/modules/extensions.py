"""Extension loading and the hooks extensions use.

An extension is ``extensions/<name>/script.py``. It may define:

* ``params``: a dict of its settings (``<name>-<key>`` entries of the settings file override them);
* ``setup()``: called once when the extension is loaded;
* functions named after a hook in ``EXTENSION_MAP`` (``input_modifier``, ``output_modifier``,
  ``custom_generate_reply``, ``model_loaded``, ``chat_state_updated``);
* ``patches``: a dict ``{"package.module:attribute": replacement}``. The replacements are
  installed when the extension loads and the originals put back when it unloads; a replacement
  reaches the original through :func:`original`.
"""

import importlib
import logging
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

from tgw_kda.modules import shared

logger = logging.getLogger(__name__)

state: Dict[str, List[Any]] = {}  # name -> [module, enabled]
setup_called = set()
available_extensions: List[str] = []
_originals: Dict[Tuple[str, str], Any] = {}
_patched_by: Dict[Tuple[str, str], str] = {}


def _target(spec: str) -> Tuple[Any, str]:
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise ValueError(f"patch target {spec!r} must look like 'package.module:attribute'")
    return importlib.import_module(module_name), attribute


def original(spec: str) -> Any:
    """What ``spec`` was before an extension patched it."""
    module, attribute = _target(spec)
    key = (module.__name__, attribute)
    return _originals.get(key, getattr(module, attribute))


def apply_patches(name: str, extension: Any) -> None:
    for spec, replacement in getattr(extension, "patches", {}).items():
        module, attribute = _target(spec)
        key = (module.__name__, attribute)
        if key in _patched_by:
            logger.warning("%s: %s is already patched by %s; skipping", name, spec, _patched_by[key])
            continue
        _originals[key] = getattr(module, attribute)
        _patched_by[key] = name
        setattr(module, attribute, replacement)


def remove_patches(name: str) -> None:
    for key in [key for key, owner in _patched_by.items() if owner == name]:
        module = importlib.import_module(key[0])
        setattr(module, key[1], _originals.pop(key))
        del _patched_by[key]


def load_extensions(names: Optional[List[str]] = None) -> None:
    """Imports, configures and enables ``names`` (default: ``--extensions``)."""
    for name in names if names is not None else (shared.args.extensions or []):
        if name in state:
            state[name][1] = True
            continue
        try:
            extension = importlib.import_module(f"tgw_kda.extensions.{name}.script")
        except ModuleNotFoundError:
            logger.error("Could not import the extension %r", name)
            continue
        for key, value in shared.settings.items():
            if key.startswith(f"{name}-"):
                extension.params[key[len(name) + 1 :]] = value
        if name not in setup_called and hasattr(extension, "setup"):
            setup_called.add(name)
            extension.setup()
        apply_patches(name, extension)
        state[name] = [extension, True]
        logger.info("Loaded the extension %r", name)


def unload_extensions(names: Optional[List[str]] = None) -> None:
    for name in list(state if names is None else names):
        if name not in state:
            continue
        remove_patches(name)
        extension = state.pop(name)[0]
        setup_called.discard(name)
        if hasattr(extension, "teardown"):
            extension.teardown()


def iterator():
    for name in sorted(state, key=lambda n: getattr(state[n][0], "params", {}).get("priority", 0)):
        extension, enabled = state[name]
        if enabled:
            yield extension, name


def _apply_string_extensions(function_name: str, text: str, state_: Dict[str, Any]) -> str:
    for extension, _ in iterator():
        if hasattr(extension, function_name):
            text = getattr(extension, function_name)(text, state_)
    return text


def _apply_event(function_name: str, *args: Any) -> None:
    for extension, name in iterator():
        if hasattr(extension, function_name):
            try:
                getattr(extension, function_name)(*args)
            except Exception:
                logger.error("%s.%s failed:\n%s", name, function_name, traceback.format_exc())


def _apply_custom_generate_reply() -> Optional[Callable[..., Any]]:
    for extension, _ in iterator():
        if hasattr(extension, "custom_generate_reply"):
            return extension.custom_generate_reply
    return None


EXTENSION_MAP: Dict[str, Any] = {
    "input": lambda *a: _apply_string_extensions("input_modifier", *a),
    "output": lambda *a: _apply_string_extensions("output_modifier", *a),
    "model_loaded": lambda *a: _apply_event("model_loaded", *a),
    "chat_state_updated": lambda *a: _apply_event("chat_state_updated", *a),
    "custom_generate_reply": _apply_custom_generate_reply,
}


def apply_extensions(typ: str, *args: Any, **kwargs: Any) -> Any:
    if typ not in EXTENSION_MAP:
        raise ValueError(f"Invalid extension type {typ}")
    return EXTENSION_MAP[typ](*args, **kwargs)
