"""Functions that fill a dict in a loop and return it, read as the comprehension they amount to.

``rings = {}``, ``for name, shape in shapes.items(): rings[name] = torch.zeros(shape,
dtype=dtype)``, ``return rings`` makes one entry per key of ``shapes``, exactly as ``{name:
torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}`` does; the summary of such a
function is that comprehension's (``["per_key", ...]``). Only the plain form counts: the dict made
empty, one unfiltered loop whose body writes it once under the loop's key, then returned.
"""

from __future__ import annotations

import ast

__all__ = ["filled_mapping"]


def filled_mapping(body: list[ast.stmt]) -> ast.DictComp | None:
    """The comprehension equivalent to ``body`` (a function's statements, docstring left
    out), when it is ``M = {}``, a loop that writes ``M[key] = value`` and ``return M``."""
    if len(body) != 3:
        return None
    made, loop, returned = body
    if not (
        isinstance(made, ast.Assign)
        and len(made.targets) == 1
        and isinstance(made.targets[0], ast.Name)
        and _empty_dict(made.value)
        and isinstance(loop, ast.For)
        and not loop.orelse
        and isinstance(returned, ast.Return)
        and isinstance(returned.value, ast.Name)
        and returned.value.id == made.targets[0].id
    ):
        return None
    name = made.targets[0].id
    key = loop.target.elts[0] if isinstance(loop.target, ast.Tuple) else loop.target
    if not isinstance(key, ast.Name):
        return None
    writes = [
        statement
        for statement in loop.body
        if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(statement))
    ]
    if len(writes) != 1 or writes[0] is not loop.body[-1]:
        return None
    write = writes[0]
    if not (
        isinstance(write, ast.Assign)
        and len(write.targets) == 1
        and isinstance(subscript := write.targets[0], ast.Subscript)
        and isinstance(subscript.value, ast.Name)
        and subscript.value.id == name
        and isinstance(subscript.slice, ast.Name)
        and subscript.slice.id == key.id
    ):
        return None
    if len(loop.body) != 1:
        return None  # other statements may bind what the value reads
    generator = ast.comprehension(target=loop.target, iter=loop.iter, ifs=[], is_async=0)
    comprehension = ast.DictComp(
        key=ast.Name(key.id, ast.Load()), value=write.value, generators=[generator]
    )
    return ast.copy_location(comprehension, loop)


def _empty_dict(value: ast.expr) -> bool:
    if isinstance(value, ast.Dict):
        return not value.keys
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "dict"
        and not value.args
        and not value.keywords
    )
