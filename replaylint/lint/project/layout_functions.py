"""Functions that only rearrange a tensor: what they return has the dtype of one parameter.

Model code wraps reshapes in small helpers (``def rearrange(t, pattern, **sizes)``, ``def
split_heads(x, n)``, ``def pad_ring(t, length)``) whose bodies rebind the tensor several times,
which a summary's straight-line reading calls unknown. Such a function keeps its tensor's dtype
when every ``return`` gives a *layout chain* of one parameter: the parameter, or a local bound
only to layout chains of it, with reshaping methods (``reshape``, ``permute``, ``transpose``,
``flatten``, indexing ...) and functions (``F.pad``, ``torch.reshape``, einops) applied. A chain
that passes anything dtype-like (``t.view(torch.bfloat16)``, ``x.view(dtype)``) is no layout.
"""

from __future__ import annotations

import ast

from replaylint.lint.project.module_facts import dotted

__all__ = ["kept_parameter"]

_METHODS = frozenset(
    {
        "reshape", "view", "permute", "transpose", "flatten", "unflatten", "squeeze",
        "unsqueeze", "expand", "expand_as", "contiguous", "movedim", "narrow", "select",
        "flip", "roll", "repeat", "t", "clone", "detach", "view_as", "swapaxes",
        "repeat_interleave", "tile", "index_select", "diagonal", "tril", "triu",
    }
)  # fmt: skip
_ATTRIBUTES = frozenset({"T", "mT", "data"})
_FUNCTIONS = frozenset(
    {
        "F.pad", "torch.nn.functional.pad", "torch.reshape", "torch.permute", "torch.transpose",
        "torch.flatten", "torch.squeeze", "torch.unsqueeze", "torch.flip", "torch.roll",
        "torch.narrow", "torch.movedim", "einops.rearrange", "einops.repeat",
    }
)  # fmt: skip


def kept_parameter(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The parameter whose dtype every value ``function`` returns has, when it only rearranges
    that parameter (see the module docstring); None otherwise."""
    params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    if not params:
        return None
    nodes = [n for statement in function.body for n in _own_nodes(statement)]
    if any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal)) for n in nodes):
        return None
    origin: dict[str, str] = {p: p for p in params}
    spoiled: set[str] = set()
    for node in sorted(
        (n for n in nodes if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))),
        key=lambda n: (n.lineno, n.col_offset),
    ):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        source = _chain_of(node.value, origin) if not isinstance(node, ast.AugAssign) else None
        for target in targets:
            if not isinstance(target, ast.Name):
                spoiled |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif source is not None and origin.get(target.id, source) == source:
                origin[target.id] = source
            else:
                spoiled.add(target.id)
    for name in nodes:  # loop targets, `with ... as x`, walrus, deletions
        if (
            isinstance(name, ast.Name)
            and isinstance(name.ctx, (ast.Store, ast.Del))
            and not _assigned_plainly(name, nodes)
        ):
            spoiled.add(name.id)
    returns = [n for n in nodes if isinstance(n, ast.Return)]
    kept = {_chain_of(r.value, origin) if r.value is not None else None for r in returns}
    if len(kept) != 1:
        return None
    parameter = kept.pop()
    if parameter is None or any(origin.get(name) == parameter for name in spoiled):
        return None
    return parameter if parameter not in spoiled else None


def _chain_of(expr: ast.expr | None, origin: dict[str, str]) -> str | None:
    """The parameter ``expr`` is a layout chain of, or None."""
    if isinstance(expr, ast.Name):
        return origin.get(expr.id)
    if isinstance(expr, ast.Subscript):
        return _chain_of(expr.value, origin)
    if isinstance(expr, ast.Attribute) and expr.attr in _ATTRIBUTES:
        return _chain_of(expr.value, origin)
    if not isinstance(expr, ast.Call) or any(_dtype_like(a) for a in _arguments(expr)):
        return None
    func = expr.func
    if isinstance(func, ast.Attribute) and func.attr in _METHODS:
        return _chain_of(func.value, origin)
    if dotted(func) in _FUNCTIONS and expr.args:
        return _chain_of(expr.args[0], origin)
    return None


def _arguments(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(k.value for k in call.keywords)]


def _dtype_like(expr: ast.expr) -> bool:
    """``torch.bfloat16``, ``dtype``, ``self.cache_dtype``: anything that may name a dtype."""
    written = dotted(expr.value if isinstance(expr, ast.Starred) else expr)
    last = written.rpartition(".")[2].lower()
    return "dtype" in last or "float" in last or "half" in last or last in {"int8", "bool"}


def _assigned_plainly(name: ast.Name, nodes: list[ast.AST]) -> bool:
    """Whether ``name`` is a target of a plain or annotated assignment (judged on its own)."""
    return any(
        isinstance(n, (ast.Assign, ast.AnnAssign))
        and any(t is name for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
        for n in nodes
    )


def _own_nodes(statement: ast.stmt) -> list[ast.AST]:
    """The nodes of ``statement``, nested functions, classes and lambdas left out."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = [statement]
    while stack:
        node = stack.pop()
        found.append(node)
        for child in ast.iter_child_nodes(node):
            if not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
            ):
                stack.append(child)
    return found
