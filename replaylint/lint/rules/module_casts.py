"""RL004's module casts: ``model.to(torch.bfloat16)`` converts the gate buffers a model holds.

One question per cast call, answered from the most to the least that is known of the receiver:
an instance of a gate-buffer class of this module (or of a class that holds one through its
submodules), an instance of such a class imported from another module of the project, a module
handed a gate-buffer submodule in the function that casts it (``draft.cache = Cache(...)``), and a
module of no known class (``model: nn.Module``, ``self`` in a mixin) in a project or module
whose classes hold a gate buffer. A guarded instance is never reported, nor a cast whose result
goes straight into a function that puts the gate buffer back to float32 (:mod:`replaylint.lint.dataflow.recasts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.conditions import condition, leaves_out
from replaylint.lint.dataflow.facts import DtypeFact
from replaylint.lint.dataflow.given_submodules import given_gate_holder
from replaylint.lint.dataflow.imported_modules import imported_gate_buffer
from replaylint.lint.dataflow.instances import chain_root
from replaylint.lint.dataflow.modules import gate_buffer_classes, module_cast, module_cast_dtypes
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.recasts import undone_for
from replaylint.lint.dataflow.submodules import (
    GateBufferHolders,
    gate_buffer_holders,
    guarded_instance,
    held_module_cast,
    passed_classes,
)
from replaylint.lint.dataflow.unknown_modules import converter_method, unknown_module
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.fixes.guard import protect_before_cast
from replaylint.lint.rules.buffer_loops import (
    as_module_cast,
    buffer_comprehension_cast,
    buffer_loop_cast,
    buffer_name_variable,
    kept_per_buffer,
    skipping_tests,
    state_dict_cast,
    tests_above,
)
from replaylint.lint.rules.wording import (
    given_holder_cast_message,
    imported_cast_message,
    module_cast_message,
    unknown_module_cast_message,
)
from replaylint.lint.syntax.nodes import is_name, keyword_arg, one_line, positional_args
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants


@dataclass(frozen=True)
class ModuleCastFinding:
    message: str
    fix: FixDraft | None
    buffers: tuple[str, ...] = ()
    """The names of the gate buffers the cast converts, as registered."""


class ModuleCasts:
    """Answers for the module casts of one file (the module's holders are read once)."""

    def __init__(self, context: FileContext, prov: Provenance) -> None:
        self._context = context
        self._prov = prov
        self._holders: GateBufferHolders | None = None
        self._raw_holders: GateBufferHolders | None = None
        self._holding: dict[tuple[int, int], bool] = {}
        self._bases: frozenset[str] | None = None
        self._index = prov.project.index if prov.project is not None else None

    def _holders_of(self) -> GateBufferHolders:
        """The module's classes that hold a float32 gate buffer, and those buffers (read once)."""
        if self._holders is None:
            self._holders = gate_buffer_holders(self._prov, self._prov.gate_buffers())
        return self._holders

    def finding(
        self, call: cst.Call, site: Site, *, known_only: bool = False
    ) -> ModuleCastFinding | None:
        """The finding for ``call`` when it casts a module holding a float32 gate buffer to a
        dtype not provably float32, and the module is not guarded (``known_only``: of a known
        class, not a module of no known class in a project that has gate buffers)."""
        prov, module = self._prov, self._context.module
        holders = self._holders_of()
        if not isinstance(call.func, cst.Attribute):
            return None
        if holders.buffers:
            cast = module_cast(prov, call, site, holders.buffers)
            if (
                cast is not None
                and cast.buffer.held_by
                and passed_classes(prov, holders.classes, chain_root(call.func.value), site)
            ):
                cast = None  # `Stack(layer_cls=PinnedLayer)`: what this instance holds decides
            cast = cast or held_module_cast(prov, call, site, holders)
            if cast is not None:
                if guarded_instance(prov, call, site) or undone_for(
                    prov, call, site, cast.buffer.name
                ):
                    return None
                fix = protect_before_cast(module, call, cast.buffer.name)
                message = module_cast_message(self._context, call, cast)
                return ModuleCastFinding(message, fix, (cast.buffer.name,))
        imports_holder = prov.imports_gate_buffer_holder()
        index = self._index
        if not (holders.buffers or imports_holder or (index is not None and index.holder_names)):
            return None  # no gate-buffer class this cast could convert: its dtype is not asked
        dtypes = module_cast_dtypes(prov, call, site)
        if dtypes is None or guarded_instance(prov, call, site):
            return None
        if imports_holder:
            imported = imported_gate_buffer(prov, call.func.value, site)
            if imported is not None and not undone_for(prov, call, site, imported.name):
                message = imported_cast_message(module, call, imported, dtypes)
                fix = protect_before_cast(module, call, imported.name)
                return ModuleCastFinding(message, fix, (imported.name,))
        given = given_gate_holder(prov, chain_root(call.func.value), site)
        if given is not None and not undone_for(prov, call, site, given.buffer):
            registered = given.registered
            where = (
                registered
                if isinstance(registered, str)
                else f"line {self._context.line_of(registered)}"
            )
            line = self._context.line_of(given.assignment)
            message = given_holder_cast_message(module, call, given, line, where, dtypes)
            fix = protect_before_cast(module, call, given.buffer)
            return ModuleCastFinding(message, fix, (given.buffer,))
        if known_only:
            return None
        return self._unknown_class(call, call.func.value, holders, site, dtypes)

    def helper_finding(self, call: cst.Call, site: Site) -> ModuleCastFinding | None:
        """``fabric.setup_module(model)`` or ``to_serving(model)``, where a function or method of
        that name in a project module this one imports from casts that argument as a module
        (:mod:`replaylint.lint.project.module_casters`), and the argument is a module of a known
        class that holds a gate buffer: reported like a cast of the argument."""
        view = self._prov.project
        name = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        if isinstance(call.func, cst.Name):
            name = call.func.value
        if view is None or name is None or name in _NOT_HELPERS or not call.args:
            return None
        if not (self._holders_of().buffers or self._prov.imports_gate_buffer_holder()):
            return None  # no class here or imported whose instance a helper could convert
        if not any(self._holds(arg.value, site) for arg in call.args if not arg.star):
            return None  # asked first: the helpers' modules are read only for a model
        for owner, qualname, (position, parameter, line, dtype) in view.index.imported_casters(
            view.module, name
        ):
            if "." not in qualname:
                # a function of the project's own (`quantize(model, mode)`) is judged where it
                # casts; a method of a precision plugin or wrapper serves any caller's model
                continue
            arg = keyword_arg(call, parameter)
            positional = positional_args(call)
            if (
                arg is None
                and position < len(positional)
                and not any(a.star for a in call.args[: position + 1])
            ):
                arg = positional[position]
            if arg is None:
                continue
            whole = _as_cast(arg.value, str(dtype))
            finding = self.finding(whole, site, known_only=True)
            if finding is None:
                continue
            module = self._context.module
            where = f"{view.index.path_of(owner)}:{line}"
            written = (
                f"`{one_line(module, call)}`, which casts `{one_line(module, arg.value)}` as a "
                f"module (`{qualname}`, {where}),"
            )
            message = finding.message.replace(f"`{one_line(module, whole)}`", written, 1)
            return ModuleCastFinding(message, finding.fix, finding.buffers)
        return None

    def _holds(self, arg: cst.BaseExpression, site: Site) -> bool:
        """Whether a module cast of ``arg`` would convert a gate buffer of a known class."""
        if not isinstance(arg, (cst.Name, cst.Attribute, cst.Call)):
            return False
        key = (id(arg), id(site.statement))
        if key not in self._holding:
            self._holding[key] = self.finding(_as_cast(arg, ""), site, known_only=True) is not None
        return self._holding[key]

    def buffer_loop_finding(
        self, loop: cst.For | cst.DictComp | cst.ListComp | cst.GeneratorExp, site: Site
    ) -> tuple[cst.Call, str, tuple[str, ...]] | None:
        """``for buf in model.buffers(): buf.data = buf.data.half()`` (or ``named_buffers()``,
        ``.to(dtype)``, a comprehension of casts): the cast of every buffer of ``model``,
        reported like ``model.half()`` at the cast in the loop, without a fix (a guard would go
        before the loop)."""
        found = (
            buffer_loop_cast(loop) if isinstance(loop, cst.For) else buffer_comprehension_cast(loop)
        )
        if found is None or kept_per_buffer(loop):
            return None
        owner, cast = found
        whole = as_module_cast(owner, cast)  # `model.half()`
        finding = self.finding(whole, site) or self._past_apply(whole, site)
        if finding is None or self._leaves_out(loop, cast, finding.buffers, site):
            return None
        module = self._context.module
        written = f"`{one_line(module, whole)}`"
        iterable = loop.iter if isinstance(loop, cst.For) else loop.for_in.iter
        loop_text = f"`{one_line(module, cast)}` over `{one_line(module, iterable)}`"
        return cast, finding.message.replace(written, loop_text, 1), finding.buffers

    def _leaves_out(
        self,
        loop: cst.For | cst.DictComp | cst.ListComp | cst.GeneratorExp,
        cast: cst.Call,
        buffers: tuple[str, ...],
        site: Site,
    ) -> bool:
        """Whether a test on the buffer's name around the cast leaves every gate buffer out
        (``exact = name.endswith(("g_cache", "state"))``; ``buf if exact else buf.to(dtype)``)."""
        key = buffer_name_variable(loop)
        if key is None or not buffers:
            return False
        statement, tests = tests_above(loop, cast)
        at = site if statement is None else Site(site.scopes, statement)
        skips = [test for test in skipping_tests(loop, cast) if _compares(test, key)]
        tests = [*tests, *((test, False) for test in skips)]

        def left_out(name: str) -> bool:  # `if name in keep: continue` with `keep` unknown too
            env = {key: name}
            return leaves_out(self._prov, tests, at, env) or any(
                condition(self._prov, test, at, env) is None for test in skips
            )

        return all(left_out(name) for name in buffers)

    def _past_apply(self, whole: cst.Call, site: Site) -> ModuleCastFinding | None:
        """The cast of every buffer of an instance of a class of the module that keeps its gate
        buffers float32 in ``_apply``: a loop that casts each tensor never runs that method."""
        prov = self._prov
        if self._raw_holders is None:
            classes = gate_buffer_classes(prov, kept=False)
            self._raw_holders = gate_buffer_holders(prov, classes, kept=False)
        raw = self._raw_holders
        if not raw.buffers:
            return None
        cast = module_cast(prov, whole, site, raw.buffers) or held_module_cast(
            prov, whole, site, raw
        )
        if cast is None:
            return None
        message = module_cast_message(self._context, whole, cast).rsplit("; ", 1)[0]
        owner = cast.buffer.cls.name.value
        message += (
            f"; `{owner}` keeps it float32 when the module is cast, but a cast of each tensor "
            "does not go through the module: leave the gate cache out of it"
        )
        return ModuleCastFinding(message, None, (cast.buffer.name,))

    def assigned_state_finding(self, call: cst.Call, site: Site) -> tuple[cst.Call, str] | None:
        """``model.load_state_dict(sd, assign=True)`` with ``sd`` a dict comprehension (or a
        local bound once to one) that casts every value: the cast tensors become the module's
        buffers, reported like the cast of ``model``."""
        if not (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "load_state_dict"
            and any(
                a.keyword is not None
                and a.keyword.value == "assign"
                and isinstance(a.value, cst.Name)
                and a.value.value == "True"
                for a in call.args
            )
            and call.args
            and call.args[0].keyword is None
        ):
            return None
        state: cst.BaseExpression | None = call.args[0].value
        where = site
        if isinstance(state, cst.Name):
            found = self._prov.lookup(state.value, site)
            if not found or len(found) != 1 or found[0][0].kind != "assign":
                return None
            state, where = found[0][0].value, found[0][1]
        cast = state_dict_cast(state) if isinstance(state, cst.DictComp) else None
        if cast is None:
            return None
        whole = as_module_cast(call.func.value, cast)
        finding = self.finding(whole, where)
        if finding is None:
            return None
        module = self._context.module
        line = self._context.line_of(cast)
        taken = (
            f"`{one_line(module, call.func)}(..., assign=True)`, which takes the tensors of a state "
            f"dict cast by `{one_line(module, cast)}` (line {line}) as the module's own,"
        )
        return call, finding.message.replace(f"`{one_line(module, whole)}`", taken, 1)

    def _unknown_class(
        self,
        call: cst.Call,
        receiver: cst.BaseExpression,
        holders: GateBufferHolders,
        site: Site,
        dtypes: tuple[DtypeFact, ...],
    ) -> ModuleCastFinding | None:
        """A cast of ``model: nn.Module`` or of ``self`` in a base of a gate-buffer class."""
        prov, module, index = self._prov, self._context.module, self._index
        local = next(iter(holders.buffers.values()), None)
        if not unknown_module(prov, receiver, site, self._holder_bases(holders)):
            return None
        converter = converter_method(prov, call, site)
        if converter is not None and index is not None and index.calls_method(converter):
            return None  # its callers are judged by what they pass (`helper_finding`)
        if local is not None:
            holder, name = local.cls.name.value, local.name
            where = f"on line {self._context.line_of(local.node)}"
        elif index is not None and index.holder_example is not None:
            example = index.holder_example
            holder, name = example.cls, example.name
            where = f"at {example.origin.path}:{example.origin.line}"
            owner = index.module_of(example.origin.path)
            if owner is not None:
                index.summary(owner)  # the finding depends on the holder's module
        else:
            return None
        if undone_for(prov, call, site, name):
            return None
        others = {buffer.name for buffer in holders.buffers.values()}
        if index is not None:
            others |= index.holder_buffers
        message = unknown_module_cast_message(module, call, holder, name, where, dtypes)
        fix = protect_before_cast(module, call, name, sorted(others - {name}))
        return ModuleCastFinding(message, fix, (name, *sorted(others - {name})))

    def _holder_bases(self, holders: GateBufferHolders) -> frozenset[str]:
        """The classes gate-buffer classes derive from: of this module, and of the project."""
        if self._bases is None:
            bases = {
                base.name.value
                for name in holders.buffers
                for base in holders.classes.mro(holders.classes.by_name[name])[1:]
            }
            if self._index is not None:
                bases |= self._index.holder_bases
            self._bases = frozenset(bases)
        return self._bases


# calls that hand a module on without casting it, whatever a project method of that name does
_NOT_HELPERS = frozenset({"append", "extend", "insert", "add_module", "register_module", "setattr"})
_HELPER_DTYPE = "__dtype_the_helper_casts_to__"
"""Stands for the dtype a helper casts to when it is not a literal: not provably float32."""


def _as_cast(receiver: cst.BaseExpression, dtype: str) -> cst.Call:
    """``receiver.half()``, ``receiver.bfloat16()``, or ``receiver.to(dtype=<not known>)``."""
    if dtype in {"float16", "bfloat16"}:
        method = "half" if dtype == "float16" else "bfloat16"
        return cst.Call(cst.Attribute(receiver, cst.Name(method)))
    keyword = cst.Arg(cst.Name(_HELPER_DTYPE), keyword=cst.Name("dtype"))
    return cst.Call(cst.Attribute(receiver, cst.Name("to")), [keyword])


def _compares(test: cst.BaseExpression, name: str) -> bool:
    """Whether ``test`` compares the buffer's name itself (``name in keep``, ``name ==
    "g_cache"``); a test of its text (``name.startswith(prefix)``) is read with a bare
    attribute name, which a dotted buffer path is not, so it decides nothing here."""
    return any(
        isinstance(node, cst.Comparison) and is_name(node.left, name) for node in descendants(test)
    )
