"""RL006's dtype tables built by a comprehension over cache names: ``{name: compute_dtype() for
name in RINGS}`` is a policy that gives every cache, the gate cache among them, one dtype.

The value is a dtype when it reads as one (a literal, a name or call named for a dtype, an entry
of a dtype table); a value that only describes an existing tensor (``t.dtype`` of the loop's own
tensor) records what is there and decides nothing. The fix is the loop's conditional one:
``torch.float32 if name == "g_cache" else <the shared dtype>``, which leaves every other entry as
it was.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.casts import to_argument_role
from replaylint.lint.dataflow.facts import Kind, SetDtype, TensorFact
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.strings import naming_variable
from replaylint.lint.fixes.conditional import conditional_fix
from replaylint.lint.rules.loop_treatment import gate_name_test
from replaylint.lint.rules.shared_helpers import HelperFinding
from replaylint.lint.rules.wording import WHY, named_gate_cache
from replaylint.lint.syntax.nodes import one_line, read_names
from replaylint.lint.syntax.sites import Site


def dtype_table_finding(
    context: FileContext, prov: Provenance, table: cst.DictComp, site: Site
) -> HelperFinding | None:
    """What to report for ``table``, when it is such a policy."""
    value, loop = table.value, table.for_in
    if loop.inner_for_in is not None or not _a_dtype(prov, value, site, loop.target):
        return None
    iterations = prov.iterations(loop.target, loop.iter, site)
    gates = []
    for env in iterations or ():
        if any(prov.condition(test.test, site, env) is False for test in loop.ifs):
            continue
        name = prov.string_value(table.key, site, env)
        if name is not None and context.gate_caches.matches(name):
            gates.append((name, env))
    if not gates:
        return None
    dtypes = tuple(f for _, env in gates for f in prov.dtype_facts(value, site, env))
    if dtypes and all(f.is_float32 for f in dtypes):
        return None
    variable = naming_variable(table.key, [env for _, env in gates])
    condition = gate_name_test(variable, [env for _, env in gates])
    fact = TensorFact(Kind.VARIABLE, value, dtypes=dtypes, target=SetDtype(value))
    torch = context.spelling.torch_at(site)
    fix = None if condition is None else conditional_fix(context.module, torch, fact, condition)
    module = context.module
    subject = named_gate_cache(context.gate_caches, gates[0][0])
    shown = " or ".join(dict.fromkeys(f"`{one_line(module, f.node)}`" for f in dtypes))
    return HelperFinding(
        value,
        f"{subject} gets {shown or f'`{one_line(module, value)}`'} from a dtype table built by a "
        f"comprehension over `{one_line(module, loop.iter)}`, which is not provably float32; {WHY}",
        fix,
    )


def _a_dtype(
    prov: Provenance, value: cst.BaseExpression, site: Site, target: cst.BaseExpression
) -> bool:
    """Whether ``value`` (or a branch of it) reads as a dtype chosen here."""
    if isinstance(value, cst.IfExp):
        return any(_a_dtype(prov, part, site, target) for part in (value.body, value.orelse))
    if not isinstance(value, (cst.Name, cst.Attribute, cst.Call)):
        return False
    variables = {name.value for name in read_names(target)}
    if (
        isinstance(value, cst.Attribute)
        and value.attr.value == "dtype"
        and any(name.value in variables for name in read_names(value.value))
    ):
        return False  # `{n: t.dtype for n, t in rings.items()}`: what each tensor has
    return to_argument_role(prov, value, site) == "dtype"
