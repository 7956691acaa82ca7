"""Mappings of tensors that a function only writes to a file (``torch.save({"rings": rings},
path)``): what they hold is the snapshot's storage format, not a live cache. A snapshot saved in
a smaller dtype is not where a gate cache goes wrong; reading it back without a cast to float32
is, and that is reported where it is read."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.torch_api import SAVERS
from replaylint.lint.syntax.nodes import method_name
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance

__all__ = ["filled_local", "only_saved"]


def only_saved(prov: Provenance, mapping: cst.BaseExpression | str | None, site: Site) -> bool:
    """Whether the function around ``site`` uses its local mapping ``mapping`` (a name, or the
    expression naming it) for nothing but filling it and passing it to a save call
    (``torch.save``, ``numpy.save``, ``safetensors``' ``save_file``)."""
    local = mapping.value if isinstance(mapping, cst.Name) else mapping
    if not isinstance(local, str) or isinstance(site.scope, cst.Module):
        return False
    saved = False
    for statement in descendants(site.scope):
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if not _mentions(small, local):
                continue
            if _builds(small, local):
                continue
            if _saves(prov, small, local, Site(site.scopes, statement)):
                saved = True
                continue
            return False  # read, returned or passed on: the mapping may be a live cache
    return saved


def filled_local(built: cst.BaseExpression, site: Site) -> str | None:
    """The local that the dict ``built`` at ``site`` fills: ``rings`` of ``rings = {...}`` or
    ``rings.update({...})``."""
    statement = site.statement
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and small.value is built and len(small.targets) == 1:
        target = small.targets[0].target
        return target.value if isinstance(target, cst.Name) else None
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        call = small.value
        if (
            method_name(call) == "update"
            and isinstance(call.func, cst.Attribute)
            and isinstance(call.func.value, cst.Name)
            and len(call.args) == 1
            and call.args[0].value is built
        ):
            return call.func.value.value
    return None


def _mentions(node: cst.CSTNode, local: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == local for n in descendants(node))


def _builds(small: cst.BaseSmallStatement, local: str) -> bool:
    """``local = ...`` (reading only itself and other names), ``local[key] = ...`` or
    ``local.update(...)``: the statement fills the mapping."""
    if isinstance(small, cst.Assign):
        targets = [t.target for t in small.targets]
        named = all(
            (isinstance(t, cst.Name) and t.value == local)
            or (
                isinstance(t, cst.Subscript)
                and isinstance(t.value, cst.Name)
                and t.value.value == local
            )
            for t in targets
        )
        return named
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        func = small.value.func
        return (
            method_name(small.value) == "update"
            and isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == local
        )
    return False


def _saves(prov: Provenance, small: cst.BaseSmallStatement, local: str, site: Site) -> bool:
    """``torch.save({"rings": local, ...}, path)``: the statement is a save call whose saved
    objects hold the mapping, and whose file does not mention it."""
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return False
    call = small.value
    places = [SAVERS[name] for name in prov.index.qualified_names(call.func) if name in SAVERS]
    if not places:
        return False
    file = call.args[places[0]] if places[0] < len(call.args) else None
    if file is None or file.keyword is not None or file.star:
        return False  # the file passed by keyword or spread: its place is not known
    saved = [arg for arg in call.args if arg is not file]
    return any(_mentions(arg.value, local) for arg in saved) and not _mentions(file.value, local)
