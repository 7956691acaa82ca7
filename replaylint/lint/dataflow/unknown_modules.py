"""Module casts of a module whose class is not known: ``model: nn.Module`` or ``self`` in a mixin.

A precision wrapper, a drafter holder or a test helper takes any ``nn.Module`` and casts it
(``model.to(dtype=self.dtype)``); a mixin of the model class casts ``self``. Nothing says which
class the module is, but in a project whose modules register float32 gate buffers the cast
converts them whenever it is given such a model. :func:`unknown_module` says whether a cast's
receiver is such a module:

* a name every binding of which is a parameter annotated ``nn.Module`` (``torch.nn.Module``,
  ``Optional[nn.Module]``, ``"nn.Module"``), or the result of a chain of module methods on one
  (``model = model.eval()``);
* a container of the modules a caller hands in (``self.modules = nn.ModuleDict(modules)``, the
  parameter unannotated or a plain ``dict`` of modules);
* ``self`` in a class that a gate-buffer class derives from (a mixin, a base class): its methods
  run on instances of that class;
* a loop variable that a project function's return annotation says is one (``for name, m in
  iter_caches(model)`` of ``-> Iterable[Tuple[str, nn.Module]]``);
* a submodule of such a module (``for owner in model.modules()``, ``named_modules()``,
  ``children()``);
* a receiver named ``model`` or ``module`` (``self.module``, ``engine.model``) that nothing
  else explains: a parameter without annotation, a loader's result, ``model_fn()``. What is
  named a model in a project of gate-buffer models is one; a receiver of a known class, or with
  an annotation, is decided by that instead.

The rule asks this only when the module itself or another module of the project holds a gate
buffer that a cast converts (classes that keep theirs float32 do not count).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from replaylint.lint.dataflow.annotated_returns import iterated_external
from replaylint.lint.dataflow.helpers import called_function
from replaylint.lint.dataflow.imported_modules import imported_class
from replaylint.lint.dataflow.instances import MODULE_CHAIN, chain_root, instance_classes
from replaylint.lint.dataflow.module_classes import module_classes
from replaylint.lint.dataflow.scalars import instance_values
from replaylint.lint.syntax.annotations import annotated_name
from replaylint.lint.syntax.nodes import dotted_name, is_name, only_statement
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

if TYPE_CHECKING:
    from replaylint.lint.dataflow.provenance import Provenance
    from replaylint.lint.dataflow.scopes import Binding

_MODULE_TYPES = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})
# what a model is called where nothing else says what it is
_MODEL_NAMES = frozenset({"model", "module", "net", "network"})
_MAX_DEPTH = 4
# containers of whatever modules they are given
_CONTAINERS = frozenset({"torch.nn.ModuleDict", "torch.nn.ModuleList", "torch.nn.Sequential"})
_PLAIN_CONTAINERS = frozenset({"dict", "Dict", "Mapping", "MutableMapping", "list", "List"})
_ANNOTATION_WORDS = frozenset({"Optional", "Union", "None", "str", "nn", "Module", "torch", "Any"})


def unknown_module(
    prov: Provenance, receiver: cst.BaseExpression, site: Site, bases: frozenset[str]
) -> bool:
    """Whether ``receiver`` is an ``nn.Module`` of no known class, or ``self`` in one of the
    classes named ``bases`` (classes that gate-buffer classes derive from)."""
    if _checked_as_torch_class(prov, receiver, site):
        return False  # `if isinstance(module, nn.Linear): module.to(dtype)`
    if _unknown(prov, receiver, site, bases, frozenset()) is True:
        return True
    return _named_model(prov, receiver, site)


def _named_model(prov: Provenance, receiver: cst.BaseExpression, site: Site) -> bool:
    """``model.half()``, ``self.module.to(dtype)``: a receiver named ``model`` or ``module``
    whose making the analysis cannot follow (a parameter without annotation, a loader's result,
    ``model_fn()``) is the project's model; one that may be of a known class, or annotated, is
    decided by that."""
    receiver = chain_root(receiver)
    if isinstance(receiver, cst.Attribute):
        name = receiver.attr.value
    elif isinstance(receiver, cst.Name):
        name = receiver.value
    else:
        return False
    if name not in _MODEL_NAMES or _checked_as_torch_class(prov, receiver, site):
        return False
    return not _partly_known(prov, receiver, site, 0)


def _checked_as_torch_class(prov: Provenance, receiver: cst.BaseExpression, site: Site) -> bool:
    """Whether the cast runs only under ``if isinstance(module, nn.Linear)``: a torch layer,
    which registers no gate buffer (``for module in model.modules(): if isinstance(...)``)."""
    if site.statement is None:
        return False
    entry = prov.index.scope(site.scope).statements.get(id(site.statement))
    text = prov.index.module.code_for_node(receiver)
    for guard in entry[1] if entry is not None else ():
        test = guard.test
        if (
            guard.polarity
            and isinstance(test, cst.Call)
            and isinstance(test.func, cst.Name)
            and test.func.value == "isinstance"
            and len(test.args) == 2
            and prov.index.module.code_for_node(test.args[0].value) == text
        ):
            checked = test.args[1].value
            kinds = checked.elements if isinstance(checked, cst.Tuple) else ()
            classes = [e.value for e in kinds] if kinds else [checked]
            if all(
                any(q.startswith("torch.") for q in prov.index.qualified_names(c)) for c in classes
            ):
                return True
    return False


def _partly_known(prov: Provenance, expr: cst.BaseExpression, site: Site, depth: int) -> bool:
    """Whether one of the ways ``expr`` may have been made says what it is: an annotated
    parameter, or an instance of a class of this module or of another module of the project
    (``model = Transformer.from_name(name)`` on one branch, ``model = quantize(model)`` on
    another: the class decides)."""
    expr = chain_root(expr)
    if depth > _MAX_DEPTH:
        return True
    if instance_classes(prov, module_classes(prov), expr, site) is not None:
        return True
    if imported_class(prov, expr, site) is not None:
        return True
    if not isinstance(expr, cst.Name):
        return False
    for binding, binding_site in prov.lookup(expr.value, site) or ():
        if binding.kind == "param" and isinstance(binding.node, cst.Param):
            known = binding.node.annotation is not None
        elif binding.kind == "assign" and binding.value is not None:
            known = _partly_known(prov, binding.value, binding_site, depth + 1)
        else:
            known = False
        if known:
            return True
    return False


def _unknown(
    prov: Provenance,
    expr: cst.BaseExpression,
    site: Site,
    bases: frozenset[str],
    seen: frozenset[int],
) -> bool | None:
    """True: a module of no known class; False: not, or not known to be; None: only a
    rebinding already being followed (``model = model.to(...)``), which decides nothing."""
    if len(seen) > _MAX_DEPTH:
        return False
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in MODULE_CHAIN
    ):
        return _unknown(prov, expr.func.value, site, bases, seen)
    if isinstance(expr, cst.Call) and prov.index.qualified_names(expr.func) & _CONTAINERS:
        # `nn.ModuleDict(modules)` of the modules a caller hands in: any of the project's
        return bool(expr.args) and all(_handed_in(prov, arg.value, site) for arg in expr.args)
    if isinstance(expr, cst.Call):  # `build_model(config)` of a function `-> nn.Module`
        called = called_function(prov.index, prov, expr, site)
        return called is not None and _builds_a_module(prov, called[0])
    if (
        isinstance(expr, cst.Attribute)
        and is_name(expr.value, "self")
        and (owner := site.enclosing_class()) is not None
    ):  # `self.model`, every value the class's methods give it
        given = [
            None if id(value) in seen else _unknown(prov, value, where, bases, seen | {id(value)})
            for value, where in instance_values(prov, owner, expr.attr.value)
        ]
        return False not in given and True in given
    if not isinstance(expr, cst.Name):
        return False
    if expr.value == "self":
        owner = site.enclosing_class()
        return owner is not None and owner.name.value in bases
    answers: list[bool | None] = []
    for binding, binding_site in prov.lookup(expr.value, site) or []:
        if binding.kind == "param" and isinstance(binding.node, cst.Param):
            answers.append(_annotated_module(prov, binding.node.annotation))
        elif binding.kind == "assign" and binding.value is not None:
            key = id(binding.node)
            answers.append(
                None
                if key in seen
                else _unknown(prov, binding.value, binding_site, bases, seen | {key})
            )
        elif binding.kind == "loop" and (
            iterated_external(prov, binding.node, binding.statement, binding_site) in _MODULE_TYPES
        ):  # `for name, m in iter_caches(model)` of `-> Iterable[Tuple[str, nn.Module]]`
            answers.append(True)
        elif binding.kind == "loop" and (walked := _submodules_walked(binding)) is not None:
            key = id(binding.node)  # `for owner in module.modules()`: any of its submodules
            answers.append(
                None if key in seen else _unknown(prov, walked, binding_site, bases, seen | {key})
            )
        else:
            answers.append(False)
    return False if False in answers else (True if True in answers else None)


def _submodules_walked(binding: Binding) -> cst.BaseExpression | None:
    """``module`` of ``for m in module.modules()`` (``children()``; the second of ``for name, m
    in module.named_modules()``) when ``binding`` is that loop's module variable."""
    loop = binding.statement
    if not (isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call)):
        return None
    func = loop.iter.func
    if not isinstance(func, cst.Attribute):
        return None
    method, target = func.attr.value, loop.target
    if method in {"modules", "children"} and target is binding.node:
        return func.value
    if (
        method in {"named_modules", "named_children"}
        and isinstance(target, cst.Tuple)
        and len(target.elements) == 2
        and target.elements[1].value is binding.node
    ):
        return func.value
    return None


def _handed_in(prov: Provenance, expr: cst.BaseExpression, site: Site) -> bool:
    """Whether ``expr`` is a parameter that says nothing of its modules' classes (no
    annotation, or a plain container of modules)."""
    if not isinstance(expr, cst.Name):
        return False
    found = prov.lookup(expr.value, site)
    if not found:
        return False
    for binding, _ in found:
        if binding.kind != "param" or not isinstance(binding.node, cst.Param):
            return False
        annotation = binding.node.annotation
        if annotation is not None and not _plain_container(annotation):
            return False
    return True


def _plain_container(annotation: cst.Annotation) -> bool:
    """``dict``, ``Dict[str, nn.Module]``, ``Optional[Mapping[...]]``, ``list``: modules of no
    class in particular."""
    words = {
        node.value
        for node in (annotation.annotation, *descendants(annotation.annotation))
        if isinstance(node, cst.Name)
    }
    return bool(words & _PLAIN_CONTAINERS) and not (words - _PLAIN_CONTAINERS - _ANNOTATION_WORDS)


def _builds_a_module(prov: Provenance, function: cst.FunctionDef) -> bool:
    """``def build_model(config) -> nn.Module``: a builder or loader of a model. A function
    given a module (``def quantize(model: nn.Module) -> nn.Module``) transforms it: what it
    returns is what it made of its argument, which may no longer hold the gate buffer."""
    if function.returns is None or not _annotated_module(prov, function.returns):
        return False
    params = function.params
    return not any(
        param.name.value in _MODEL_NAMES or _annotated_module(prov, param.annotation)
        for param in (*params.posonly_params, *params.params, *params.kwonly_params)
    )


def _annotated_module(prov: Provenance, annotation: cst.Annotation | None) -> bool:
    """``nn.Module``, ``torch.nn.Module``, ``Module`` imported from ``torch.nn``, optional or
    written as a string."""
    node = annotated_name(annotation) if annotation is not None else None
    if not isinstance(node, (cst.Name, cst.Attribute)):
        return False
    written = dotted_name(node) or ""
    if written.endswith("nn.Module"):
        return True
    return bool(prov.index.qualified_names(node) & _MODULE_TYPES)


def converter_method(prov: Provenance, call: cst.Call, site: Site) -> str | None:
    """The name of the method when ``call`` casts one of its parameters and returns the result
    (``def convert_module(self, module): return module.to(dtype=self.dtype)``): a precision
    plugin's converter, whose callers decide which model it is given."""
    scopes = site.scopes
    function = site.scope
    if not (
        isinstance(function, cst.FunctionDef)
        and len(scopes) >= 2
        and isinstance(scopes[-2], cst.ClassDef)
        and not function.name.value.startswith("__")
        and isinstance(call.func, cst.Attribute)
    ):
        return None
    receiver = chain_root(call.func.value)
    if not isinstance(receiver, cst.Name) or receiver.value in {"self", "cls"}:
        return None
    name = receiver.value
    found = prov.lookup(name, site)
    if not found or not any(b.kind == "param" for b, _ in found):
        return None
    for binding, _ in found:
        value = binding.value
        if binding.kind == "param":
            continue
        root = chain_root(value) if value is not None else None
        if not (isinstance(root, cst.Name) and root.value == name):
            return None  # the parameter is replaced by something else on some path
    statement = only_statement(site.statement) if site.statement is not None else None
    returned = isinstance(statement, cst.Return) and statement.value is call
    if not returned and isinstance(statement, cst.Assign):
        targets = statement.targets
        returned = (
            statement.value is call
            and len(targets) == 1
            and isinstance(targets[0].target, cst.Name)
            and targets[0].target.value == name
            and any(
                isinstance(r.value, cst.Name) and r.value.value == name
                for r, _ in prov.index.scope(function).returns
            )
        )
    return function.name.value if returned else None
