"""Which functions of a module read tensors as they were stored: a summary's ``loaders``.

``def load_ring(path): return torch.load(path)`` hands its callers what the file holds, in the
dtype it was saved with; an importer that makes a gate cache of its result makes it that dtype.
"""

from __future__ import annotations

import ast
from typing import Any

from replaylint.lint.project.module_facts import dotted

Value = list[Any]

_READERS = frozenset({"load", "frombuffer", "from_file", "load_file", "memmap", "fromfile"})
_CASTS = frozenset({"to", "float", "half", "bfloat16", "double", "type", "type_as", "astype"})


def raw_reads(function: ast.FunctionDef | ast.AsyncFunctionDef, value_of: Any) -> list[Value]:
    """The calls of ``function`` that may read tensors (``torch.load``, ``torch.frombuffer``,
    ``np.load`` ... by their last name; the importer resolves them), when it returns something
    and casts nothing: what it returns is read as stored."""
    reads: list[Value] = []
    returns = False
    for node in ast.walk(function):
        if isinstance(node, ast.Return) and node.value is not None:
            returns = True
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func).rpartition(".")[2]
        if name in _CASTS:
            return []
        if name in _READERS and isinstance(node.func, (ast.Name, ast.Attribute)):
            reads.append(value_of(node.func))
    return reads if returns else []
