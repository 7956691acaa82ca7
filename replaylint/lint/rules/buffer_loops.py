"""Loops that cast every buffer of a module: ``for buf in model.buffers(): buf.data =
buf.data.half()`` (or any cast tensor: ``buf.data = saved[name].to(device, dtype=dtype)``), loops over ``named_buffers()`` that put each one back cast
(``setattr(model, name, buf.to(dtype))``), and loops that cast each one on its way elsewhere
(``buf = buf.to(dtype)`` before it is exported, ``state[name] = buf.detach().cpu().to(dtype)``,
``.type_as(other)``), and comprehensions that do the same (``{name: buf.to(dtype) for name, buf
in model.named_buffers()}``); so does ``model.load_state_dict(sd, assign=True)`` of a state dict
whose every value was cast (``{k: v.to(dtype) for k, v in sd.items()}``), which makes the cast
tensors the module's own. RL004 reports them like ``model.half()``."""

from __future__ import annotations

import libcst as cst

from replaylint.lint.dataflow.torch_api import DTYPE_KEEPING_COPIES
from replaylint.lint.syntax.nodes import is_name, keyword_arg
from replaylint.lint.syntax.traversal import ancestors, branch_tests, descendants

_BUFFER_LISTS = frozenset({"buffers", "named_buffers"})
_CASTS = frozenset({"to", "type", "type_as", "half", "bfloat16", "float16"})


def buffers_walked(iterable: cst.BaseExpression) -> cst.BaseExpression | None:
    """The module whose buffers ``iterable`` walks: ``model`` of ``model.buffers()``,
    ``model.named_buffers()``, ``model._buffers.items()`` or ``.values()``, each also in
    ``list(...)`` (set while iterating); None for anything else."""
    if (
        isinstance(iterable, cst.Call)
        and is_name(iterable.func, "list")
        and len(iterable.args) == 1
        and isinstance(iterable.args[0].value, cst.Call)
    ):
        iterable = iterable.args[0].value
    if not (isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Attribute)):
        return None
    method, receiver = iterable.func.attr.value, iterable.func.value
    if method in _BUFFER_LISTS:
        return receiver
    if (
        method in {"items", "values"}
        and not iterable.args
        and isinstance(receiver, cst.Attribute)
        and receiver.attr.value == "_buffers"
    ):
        return receiver.value
    return None


def buffer_loop_cast(loop: cst.For) -> tuple[cst.BaseExpression, cst.Call] | None:
    """The module and the cast of ``for buf in module.buffers(): buf.data = buf.data.<cast>``
    (``for name, buf in module.named_buffers()``, the cast of ``buf`` itself too, and a tensor
    made in another dtype that takes each buffer's place: ``host = torch.empty(buf.shape,
    dtype=dtype)``, ``module._buffers[name] = host``)."""
    owner = buffers_walked(loop.iter)
    if owner is None or not isinstance(loop.body, cst.IndentedBlock):
        return None
    target: cst.BaseExpression = loop.target
    key: str | None = None
    if isinstance(target, cst.Tuple) and len(target.elements) == 2:
        first = target.elements[0].value
        key = first.value if isinstance(first, cst.Name) else None
        target = target.elements[1].value
    if not isinstance(target, cst.Name):
        return None
    buffer = target.value
    made = _made_in_body(loop.body, target.value)
    for statement in _statements(loop.body):
        put = _put_back(statement, key)  # `setattr(model, name, buf.to(dtype))`
        if (
            put is not None
            and isinstance(put, cst.Call)
            and isinstance(put.func, cst.Attribute)
            and is_name(put.func.value, buffer)
        ):
            return owner, put
        if isinstance(put, cst.Name) and put.value in made:
            return owner, made[put.value]
        if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1):
            continue
        written, value = statement.targets[0].target, statement.value
        if _is_data_of(written, buffer) or is_name(written, buffer):
            if (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and (_is_data_of(value.func.value, buffer) or is_name(value.func.value, buffer))
            ):
                return owner, value
            if _is_data_of(written, buffer) and _casts(value):
                # `buf.data = saved.to(device, dtype=dtype)`: every buffer takes a cast tensor
                assert isinstance(value, cst.Call)
                return owner, value
        elif isinstance(written, cst.Subscript):  # `exported[name] = buf.detach().to(dtype)`
            cast = _cast_in_either(value, buffer)
            if cast is not None:
                return owner, cast
            if _buffer_slot(written, key) and isinstance(value, cst.Name) and value.value in made:
                return owner, made[value.value]  # `module._buffers[name] = host`
    return None


MADE_WITH_DTYPE = frozenset(
    {"empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like"}
    | {"new_empty", "new_zeros", "new_ones", "new_full"}
)


def _made_in_body(block: cst.IndentedBlock, buffer: str) -> dict[str, cst.Call]:
    """The locals the loop body binds to a tensor made with a ``dtype`` (``host =
    torch.empty(buf.shape, dtype=self.host_dtype)``), each bound once; one made in the buffer's
    own dtype (``dtype=buf.dtype``) casts nothing."""
    made: dict[str, cst.Call] = {}
    bound: dict[str, int] = {}
    for statement in _statements(block):
        if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
            continue
        target, value = statement.targets[0].target, statement.value
        if not isinstance(target, cst.Name):
            continue
        bound[target.value] = bound.get(target.value, 0) + 1
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in MADE_WITH_DTYPE
            and (dtype := keyword_arg(value, "dtype")) is not None
            and not (
                isinstance(dtype.value, cst.Attribute)
                and dtype.value.attr.value == "dtype"
                and is_name(dtype.value.value, buffer)
            )
        ):
            made[target.value] = value
    return {name: call for name, call in made.items() if bound[name] == 1}


def _buffer_slot(written: cst.Subscript, key: str | None) -> bool:
    """``module._buffers[name]`` under the loop's own name."""
    index = written.slice[0].slice if len(written.slice) == 1 else None
    return (
        key is not None
        and isinstance(written.value, cst.Attribute)
        and written.value.attr.value == "_buffers"
        and isinstance(index, cst.Index)
        and is_name(index.value, key)
    )


def skipping_tests(loop: cst.CSTNode, cast: cst.CSTNode) -> list[cst.BaseExpression]:
    """The tests of ``if <test>: continue`` statements of the loop's body before the statement
    that holds ``cast`` (``if buf is None or name in keep: continue``): the cast runs when each
    is false."""
    if not (isinstance(loop, cst.For) and isinstance(loop.body, cst.IndentedBlock)):
        return []
    tests: list[cst.BaseExpression] = []
    for line in loop.body.body:
        if any(node is cast for node in descendants(line)):
            break
        if isinstance(line, cst.If) and isinstance(line.body, cst.IndentedBlock):
            lines = [s for s in line.body.body if isinstance(s, cst.SimpleStatementLine)]
            if any(isinstance(small, cst.Continue) for s in lines for small in s.body):
                tests.append(line.test)
    return tests


def buffer_name_variable(
    loop: cst.For | cst.DictComp | cst.ListComp | cst.GeneratorExp,
) -> str | None:
    """``name`` of ``for name, buf in model.named_buffers()`` (or of the comprehension's
    ``for``): what says which buffer an iteration casts."""
    target, iterable = (
        (loop.target, loop.iter)
        if isinstance(loop, cst.For)
        else (loop.for_in.target, loop.for_in.iter)
    )
    if isinstance(iterable, cst.Call) and is_name(iterable.func, "list") and iterable.args:
        iterable = iterable.args[0].value
    if not (
        isinstance(iterable, cst.Call)
        and isinstance(iterable.func, cst.Attribute)
        and iterable.func.attr.value in {"named_buffers", "items"}
        and buffers_walked(iterable) is not None
        and isinstance(target, cst.Tuple)
        and len(target.elements) == 2
        and isinstance(name := target.elements[0].value, cst.Name)
    ):
        return None
    return name.value


def tests_above(
    loop: cst.CSTNode, cast: cst.CSTNode
) -> tuple[cst.CSTNode | None, list[tuple[cst.BaseExpression, bool]]]:
    """The statement of the loop's body that holds ``cast``, and the tests of the conditionals
    and ``if`` statements around it within the loop, each with whether ``cast`` is in the
    branch the test takes when true."""
    path = [*ancestors(loop, cast), cast]
    lines = [node for node in path if isinstance(node, cst.SimpleStatementLine)]
    return (lines[-1] if lines else None), branch_tests(path)


def kept_per_buffer(loop: cst.For | cst.DictComp | cst.ListComp | cst.GeneratorExp) -> bool:
    """Whether the loop decides float32 per buffer by its name (``dtype=torch.float32 if
    name.rsplit(".", 1)[-1] in ("g_cache",) else dtype``, ``buf.float() if ... else
    buf.half()``): it casts every buffer but the ones the test picks."""
    key = buffer_name_variable(loop)
    if key is None:
        return False
    body: cst.CSTNode = (
        loop.body
        if isinstance(loop, cst.For)
        else (loop.value if isinstance(loop, cst.DictComp) else loop.elt)
    )
    for node in descendants(body):
        if not isinstance(node, cst.IfExp):
            continue
        reads = any(isinstance(n, cst.Name) and n.value == key for n in descendants(node.test))
        if reads and (_float32(node.body) or _float32(node.orelse)):
            return True
    return False


def _float32(expr: cst.BaseExpression) -> bool:
    """``torch.float32`` or ``x.float()``."""
    if isinstance(expr, cst.Attribute):
        return expr.attr.value == "float32"
    return (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "float"
        and not expr.args
    )


def _casts(value: cst.BaseExpression) -> bool:
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _CASTS
    )


def _cast_of(value: cst.BaseExpression, buffer: str) -> cst.Call | None:
    """The cast in ``buf.detach().cpu().to(dtype)``; None when ``value`` is no cast of the
    buffer ``buffer``."""
    if not (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _CASTS
    ):
        return None
    receiver = value.func.value
    while (
        isinstance(receiver, cst.Call)
        and isinstance(receiver.func, cst.Attribute)
        and receiver.func.attr.value in DTYPE_KEEPING_COPIES
    ):
        receiver = receiver.func.value
    if not (is_name(receiver, buffer) or _is_data_of(receiver, buffer)):
        return None
    return value


def as_module_cast(owner: cst.BaseExpression, cast: cst.Call) -> cst.Call:
    """``model.half()`` for the cast ``buf.half()`` of each buffer of ``model``;
    ``buf.type_as(x)`` is ``model.to(x.dtype)``, a tensor made with ``dtype=d`` in each
    buffer's place ``model.to(d)``."""
    assert isinstance(cast.func, cst.Attribute)
    dtype_arg = keyword_arg(cast, "dtype")
    if cast.func.attr.value in MADE_WITH_DTYPE and dtype_arg is not None:
        # `torch.empty(buf.shape, dtype=dtype)` in each buffer's place: `model.to(dtype)`
        return cst.Call(cst.Attribute(owner, cst.Name("to")), [cst.Arg(dtype_arg.value)])
    if cast.func.attr.value == "type_as" and len(cast.args) == 1:
        dtype = cst.Attribute(cast.args[0].value, cst.Name("dtype"))
        return cst.Call(cst.Attribute(owner, cst.Name("to")), [cst.Arg(dtype)])
    return cst.Call(cst.Attribute(owner, cast.func.attr), cast.args)


def buffer_comprehension_cast(
    comprehension: cst.DictComp | cst.ListComp | cst.GeneratorExp,
) -> tuple[cst.BaseExpression, cst.Call] | None:
    """The module and the cast of ``{name: buf.to(dtype) for name, buf in
    module.named_buffers()}`` (a list or generator of ``buf.half()`` over ``module.buffers()``
    too; a conditional value casts in either branch), unless a filter may leave the gate
    buffer out (``if name != "g_cache"``)."""
    for_in = comprehension.for_in
    owner = buffers_walked(for_in.iter)
    if for_in.inner_for_in is not None or owner is None:
        return None
    if any(_excludes(test.test) for test in for_in.ifs):
        return None
    target: cst.BaseExpression = for_in.target
    if isinstance(target, cst.Tuple) and len(target.elements) == 2:
        target = target.elements[1].value
    if not isinstance(target, cst.Name):
        return None
    value = comprehension.value if isinstance(comprehension, cst.DictComp) else comprehension.elt
    cast = _cast_in_either(value, target.value)
    return None if cast is None else (owner, cast)


def state_dict_cast(comprehension: cst.DictComp) -> cst.Call | None:
    """The cast of every value of ``{k: v.to(dtype) if v.is_floating_point() else v for k, v in
    state_dict.items()}``; None when it leaves entries out or casts none."""
    for_in = comprehension.for_in
    target = for_in.target
    if for_in.inner_for_in is not None or any(_excludes(test.test) for test in for_in.ifs):
        return None
    if not (isinstance(target, cst.Tuple) and len(target.elements) == 2):
        return None
    value_name = target.elements[1].value
    if not isinstance(value_name, cst.Name):
        return None
    return _cast_in_either(comprehension.value, value_name.value)


def _cast_in_either(value: cst.BaseExpression, buffer: str) -> cst.Call | None:
    """The cast of ``buffer`` that ``value`` is, or one branch of it (``buf.to(dtype) if
    buf.is_floating_point() else buf``)."""
    for branch in (value.body, value.orelse) if isinstance(value, cst.IfExp) else (value,):
        cast = _cast_of(branch, buffer)
        if cast is not None:
            return cast
    return None


def _put_back(statement: cst.BaseSmallStatement, key: str | None) -> cst.BaseExpression | None:
    """The value of ``setattr(model, name, value)`` or ``model.register_buffer(name, value)``
    under the loop's own name."""
    if key is None or not (
        isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call)
    ):
        return None
    call = statement.value
    args = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    if is_name(call.func, "setattr") and len(args) == 3 and is_name(args[1], key):
        return args[2]
    if (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "register_buffer"
        and len(args) >= 2
        and is_name(args[0], key)
    ):
        return args[1]
    return None


def _statements(block: cst.BaseSuite) -> list[cst.BaseSmallStatement]:
    """The small statements of ``block`` and of the ``if`` blocks in it (``if
    buf.is_floating_point(): ...``, ``if name.endswith("_ring"): ...``); not under a test that
    leaves buffers out (``if name != "g_cache"``, ``if not ...``), which may be the gate's."""
    found: list[cst.BaseSmallStatement] = []
    for line in block.body if isinstance(block, cst.IndentedBlock) else ():
        if isinstance(line, cst.SimpleStatementLine):
            found.extend(line.body)
        elif isinstance(line, cst.If) and not _excludes(line.test):
            found.extend(_statements(line.body))
    return found


def _excludes(test: cst.BaseExpression) -> bool:
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return True
    if isinstance(test, cst.Comparison):
        return any(
            isinstance(c.operator, (cst.NotEqual, cst.NotIn, cst.IsNot))
            and not is_name(c.comparator, "None")  # `dtype is not None`: leaves no buffer out
            for c in test.comparisons
        )
    if isinstance(test, cst.BooleanOperation):
        return _excludes(test.left) or _excludes(test.right)
    return False


def _is_data_of(expr: cst.BaseExpression, name: str) -> bool:
    return (
        isinstance(expr, cst.Attribute) and expr.attr.value == "data" and is_name(expr.value, name)
    )


def casts_a_module(loop: cst.CSTNode) -> bool:
    """``for name, buf in model.named_buffers(): setattr(model, name, buf.half())`` and its
    comprehensions: a module cast, reported as one."""
    if isinstance(loop, cst.For):
        return buffer_loop_cast(loop) is not None
    if isinstance(loop, (cst.DictComp, cst.ListComp, cst.GeneratorExp)):
        return buffer_comprehension_cast(loop) is not None
    return False
