"""Emit each guard warning once per process, from eager code and from code torch.compile traces.

A ``warnings.warn`` inside a region that torch.compile traces is a graph break (an error under
``fullgraph=True``). Dynamo specialises compiled code on dtypes, so a wrong dtype is seen exactly
when the function is traced: at that moment the warning is emitted by a ``comptime`` callback,
which runs ordinary Python during tracing and adds nothing to the graph.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch

from replaylint.guards._wording import WarningKey, render_warning

__all__ = ["emit_once"]

_emitted: set[WarningKey] = set()
_emitted_lock = threading.Lock()


def emit_once(warning_key: WarningKey, stacklevel: int) -> None:
    """Warn once per key; ``stacklevel`` counts from the caller, as for ``warnings.warn``."""
    if torch.compiler.is_compiling():
        _warn_once_while_compiling(warning_key)
    else:
        _warn_once(warning_key, stacklevel + 1)


def _warn_once(key: WarningKey, stacklevel: int) -> None:
    """Warn unless ``key`` was warned about before; ``stacklevel`` counts from the caller."""
    with _emitted_lock:
        if key in _emitted:
            return
        _emitted.add(key)
    message, category = render_warning(key)
    warnings.warn(message, category, stacklevel=stacklevel + 1)


def _warn_once_while_compiling(warning_key: WarningKey) -> None:
    # Imported here: torch._dynamo is loaded whenever this runs, and costs ~1 s to import eagerly.
    from torch._dynamo.comptime import comptime

    comptime(_emit_during_trace)


def _emit_during_trace(ctx: Any) -> None:
    key = ctx.get_local("warning_key").as_python_constant()
    # No user frame exists while tracing; the warning points at this module.
    _warn_once(key, stacklevel=1)
