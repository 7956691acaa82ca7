"""Hypothesis strategies for the linter's fuzz tests: Python programs that hold gate-cache code.

Two sources of programs:

- :func:`gate_cache_programs` assembles realistic ReplaySSM gate-cache code from pieces: torch
  imports under their aliases, allocations, loads, casts, comprehensions and loops over cache
  kinds, decode entry-point calls, wrapped in functions, methods, decorators, ``match`` and
  ``with`` blocks, and laid out oddly (line continuations, arguments split over lines, comments
  inside calls, semicolons, tabs, CRLF, no final newline, arbitrary comment text).
- :func:`spliced_programs` takes a program hypothesmith generates from Python's grammar and
  splices a few gate-cache statements in between its top-level statements: without them the
  pre-filter would skip almost every generated program and nothing would be exercised.

Every program these strategies produce is valid Python (``ast.parse`` accepts it); the property
tests assert that first, so a strategy that produces invalid code fails loudly instead of testing
nothing.
"""

from __future__ import annotations

import ast
import functools
import re
import warnings
from dataclasses import dataclass

import hypothesmith
from hypothesis import assume
from hypothesis import strategies as st

from replaylint.lint.gatecache.names import DEFAULT_GATE_CACHE_PATTERNS

__all__ = [
    "GATE_NAMES",
    "Program",
    "gate_cache_programs",
    "grammar_programs",
    "spliced_programs",
]

# Names the default patterns match (DEFAULT_GATE_CACHE_PATTERNS), in the spellings code uses:
# plural, upper case, leading underscores, prefixed.
GATE_NAMES: tuple[str, ...] = (
    "g_cache",
    "gate_cache",
    "replayssm_g",
    "g_caches",
    "G_CACHE",
    "_g_cache",
    "__gate_cache",
    "layer0_g_cache",
    "kv_gate_cache",
    "replayssm_gs",
    "Replayssm_G",
    "gate_ring",
    "draft_gate_ring",
    "padding_replayssm_g",
)
assert all(pattern.lstrip("*_") in {"g_cache", "gate_cache", "gate_ring", "replayssm_g"}
           for pattern in DEFAULT_GATE_CACHE_PATTERNS)  # fmt: skip
# Rings that may legitimately hold the model dtype, and names that must never count.
OTHER_NAMES: tuple[str, ...] = ("d_cache", "k_cache", "kv_cache", "g", "gates", "state", "ring")
# Names a decode call may teach (learned names); `ring`/`g` are too generic to be learned.
TAUGHT_NAMES: tuple[str, ...] = ("decay_ring", "replay_gates", "ring", "g")
ENTRY_POINTS: tuple[str, ...] = (
    "kda_replayssm_decode",
    "ops.fused_recurrent_kda_replayssm_decode",
    "helion_fused_recurrent_kda_replayssm_decode",
    "decode",  # not an entry point: a decoy
)


@dataclass(frozen=True)
class _Torch:
    """How the program spells torch: the module alias (None: not imported as a module) and the
    names imported from it directly."""

    alias: str | None
    direct: frozenset[str]

    def attr(self, name: str) -> str:
        if name in self.direct:
            return name
        return f"{self.alias or 'torch'}.{name}"


@dataclass(frozen=True)
class Program:
    """A generated program and how it was laid out (for readable failure reports)."""

    source: str
    newline: str

    def __repr__(self) -> str:
        return f"Program(source={self.source!r})"


_IMPORT_STYLES: tuple[tuple[str, _Torch], ...] = (
    ("import torch", _Torch("torch", frozenset())),
    ("import torch as th", _Torch("th", frozenset())),
    ("import torch, os", _Torch("torch", frozenset())),
    (
        "from torch import zeros, empty, bfloat16, float32, float16",
        _Torch(None, frozenset({"zeros", "empty", "bfloat16", "float32", "float16"})),
    ),
    (
        "import torch\nfrom torch import bfloat16 as bf16, zeros_like",
        _Torch("torch", frozenset({"zeros_like"})),
    ),
    ("import torch.nn as nn\nimport torch", _Torch("torch", frozenset())),
    ("", _Torch(None, frozenset())),  # torch used without an import: a fix must add it
)

# Characters that Python's tokenizer does not take as line breaks but str.splitlines does, and
# other oddities worth having in comments and strings.
_ODD_CHARACTERS = "\x0c\x0b\x1c\x1d\x1e\x85\u2028\u2029\t\u0130\u212a\ufeff\u00e9\U0001f600"

comment_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(_ODD_CHARACTERS),
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"),
    ),
    max_size=12,
)


@st.composite
def _comment(draw: st.DrawFn) -> str:
    text = draw(
        st.one_of(
            comment_text,
            st.sampled_from(
                ["noqa", "noqa: RL001", "noqa: RL003,RL005", "replaylint: noqa: RL004", "g_cache"]
            ),
        )
    )
    return f"# {text}"


@st.composite
def _dtype(draw: st.DrawFn, torch: _Torch) -> str:
    literal = st.sampled_from(
        ["bfloat16", "float16", "half", "float32", "float", "double", "float64"]
    ).map(torch.attr)
    choices = [
        literal,
        st.sampled_from(
            [
                "dtype",
                "self.dtype",
                "config.torch_dtype",
                "d_cache.dtype",
                "model_dtype",
                "ring_dtype",
            ]
        ),
        st.sampled_from(['"bfloat16"', "'float32'"]),
    ]
    if "bfloat16" in torch.direct:
        choices.append(st.sampled_from(["bfloat16", "float32", "float16"]))
    return draw(st.one_of(choices))


@st.composite
def _separator(draw: st.DrawFn) -> str:
    """Between call arguments: inside parentheses any line layout is valid."""
    return draw(
        st.sampled_from([", ", ",", " , ", ",\n", ",\n\t", ", \\\n  ", ",  # c\n  ", ",\n\n  "])
    )


@st.composite
def _call(draw: st.DrawFn, function: str, args: list[str], keywords: dict[str, str]) -> str:
    spaced_equals = draw(st.booleans())
    parts = list(args) + [
        f"{name} = {value}" if spaced_equals else f"{name}={value}"
        for name, value in keywords.items()
    ]
    if len(parts) > 1:
        parts = draw(st.permutations(parts)) if not args else parts
    separator = draw(_separator())
    trailing = draw(st.sampled_from(["", ",", ",\n"])) if parts else ""
    opening = draw(st.sampled_from(["(", "(\n    ", "( "]))
    return f"{function}{opening}{separator.join(parts)}{trailing})"


@st.composite
def _keywords(draw: st.DrawFn, torch: _Torch) -> dict[str, str]:
    keywords: dict[str, str] = {}
    if draw(st.integers(0, 3)):
        keywords["dtype"] = draw(_dtype(torch))
    if draw(st.booleans()):
        keywords["device"] = draw(st.sampled_from(["device", '"cuda"', "self.device"]))
    return keywords


@st.composite
def _allocation(draw: st.DrawFn, torch: _Torch) -> str:
    kind = draw(st.sampled_from(["factory", "like", "new", "full", "splat", "tensor"]))
    keywords = draw(_keywords(torch))
    if kind == "factory":
        function = torch.attr(draw(st.sampled_from(["zeros", "empty", "ones", "randn"])))
        shape = draw(st.sampled_from([["shape"], ["slots", "hv", "ring", "k"], ["*shape"]]))
        return draw(_call(function, shape, keywords))
    if kind == "full":
        return draw(_call(torch.attr("full"), ["shape", "0.0"], keywords))
    if kind == "like":
        function = torch.attr(draw(st.sampled_from(["zeros_like", "empty_like", "ones_like"])))
        return draw(_call(function, [draw(st.sampled_from(["d_cache", "other", "x"]))], keywords))
    if kind == "new":
        method = draw(st.sampled_from(["new_zeros", "new_empty", "new_ones"]))
        receiver = draw(st.sampled_from(["d_cache", "pool.d_cache[:, slot]", "x"]))
        return draw(_call(f"{receiver}.{method}", ["shape"], keywords))
    if kind == "tensor":
        return draw(_call(torch.attr("tensor"), ["[0.0, 1.0]"], keywords))
    return draw(_call(torch.attr("empty"), ["shape", "**factory_kwargs"], {}))


@st.composite
def _load(draw: st.DrawFn, torch: _Torch, key: str) -> str:
    return draw(
        st.sampled_from(
            [
                f'{torch.attr("load")}(path)["{key}"]',
                f'{torch.attr("load")}(path, map_location="cpu")',
                f'state_dict["{key}"]',
                f'state_dict.get("{key}")',
                f'f.get_tensor("{key}")',
                f'safetensors.torch.load_file(path)["{key}"]',
                f"{torch.attr('from_numpy')}(np.load(path))",
                "saved.clone()",
            ]
        )
    )


@st.composite
def _cast(draw: st.DrawFn, torch: _Torch, receiver: str) -> str:
    dtype = draw(_dtype(torch))
    return draw(
        st.sampled_from(
            [
                f"{receiver}.to({dtype})",
                f"{receiver}.to(dtype={dtype})",
                f"{receiver}.to(device, {dtype}, non_blocking=True)",
                f"{receiver}.half()",
                f"{receiver}.bfloat16()",
                f"{receiver}.float()",
                f"{receiver}.half().contiguous()",
                f'{receiver}.type("torch.cuda.HalfTensor")',
                f"{receiver}.to(d_cache)",
                f"{receiver}.cuda()",
            ]
        )
    )


@st.composite
def _value(draw: st.DrawFn, torch: _Torch, key: str) -> str:
    """An expression that a gate cache may be bound to."""
    base = draw(
        st.one_of(
            _allocation(torch),
            _load(torch, key),
            st.sampled_from(["g_cache", "self.g_cache", "saved", "d_cache"]).flatmap(
                lambda receiver: _cast(torch, receiver)
            ),
        )
    )
    wrap = draw(st.integers(0, 13))
    other = "saved_gates"
    if wrap == 6:
        base = f"{base} if flag else {other}"
    elif wrap == 7:
        base = f"{other} if flag else {base}"
    elif wrap == 8:
        base = f"{base} or {other}"
    elif wrap == 9:
        base = f"{base} * 1.0"
    elif wrap == 10:
        base = f"-{base}"
    elif wrap == 11:
        base = f"(lambda: {base})()"
    elif wrap == 12:
        base = f"{base}[0]"
    elif wrap == 1:
        base = f"{torch.attr('nn')}.Parameter({base}, requires_grad=False)"
    elif wrap == 2:
        base = f"({base}).to(device)"
    elif wrap == 3:
        base = f"(\n    {base}\n)"
    elif wrap == 4:
        base = f"{base}.float()"
    elif wrap == 5:
        base = f"{base}.contiguous()"
    return base


@st.composite
def _target(draw: st.DrawFn, *, in_method: bool) -> tuple[str, str]:
    """An assignment target and the name (or string key) it binds."""
    name = draw(st.sampled_from(GATE_NAMES + OTHER_NAMES))
    forms = [
        name,
        f"pool.{name}",
        f'caches["{name}"]',
        f"caches['{name}']",
        f"self.layers[0].{name}",
    ]
    if in_method:
        forms.append(f"self.{name}")
    return draw(st.sampled_from(forms)), name


@st.composite
def _statement(draw: st.DrawFn, torch: _Torch, *, in_method: bool) -> str:
    """One gate-cache statement, possibly spanning several lines (never indented inside)."""
    target, key = draw(_target(in_method=in_method))
    value = draw(_value(torch, key))
    kind = draw(st.integers(0, 27))
    if kind == 0:
        statement = f"{target}: {torch.attr('Tensor')} = {value}"
    elif kind == 1:
        statement = f"{target} = \\\n    {value}"
    elif kind == 2:
        statement = f"x = 1; {target} = {value}; y = 2"
    elif kind == 3:
        register = "self.register_buffer" if in_method else "module.register_buffer"
        statement = f'{register}("{key}", {value}, persistent=False)'
    elif kind == 4:
        first = draw(_value(torch, "d_cache"))
        statement = f'caches = {{"d_cache": {first}, "{key}": {value}}}'
    elif kind == 5:
        statement = f'caches = {{f"{{kind}}_cache": {value} for kind in ("d", "k", "g")}}'
    elif kind == 6:
        statement = f"{target} = [{value} for _ in range(layers)]"
    elif kind == 7:
        setter = "self.register_buffer(name, " if in_method else "setattr(pool, name, "
        statement = f'for name in ("d_cache", "k_cache", "{key}"):\n    {setter}{value})'
    elif kind == 8:
        statement = f"d_cache, k_cache, {key} = ({value} for _ in range(3))"
    elif kind == 9:
        statement = f"if ({key} := {value}) is not None:\n    pass"
    elif kind == 10:
        statement = (
            f"match kind:\n    case 'g':\n        {target} = {value}\n"
            f"    case _:\n        {key} = None"
        )
    elif kind == 11:
        statement = f'print(f"{{{key}.dtype!r:>10}} {{{value}}}")'
    elif kind == 12:
        entry = draw(st.sampled_from(ENTRY_POINTS))
        args = ", ".join(["q", "k", "v", "a", "b", "A_log", "dt_bias", "scale", "state", key])
        statement = f"{entry}({args}, out)"
    elif kind == 13:
        entry = draw(st.sampled_from(ENTRY_POINTS))
        argument = draw(st.sampled_from([key, value, f"{key}.half()", f'caches["{key}"]']))
        statement = f"{entry}(*step_inputs, g_cache={argument})"
    elif kind == 14:
        taught = draw(st.sampled_from(TAUGHT_NAMES))
        entry = draw(st.sampled_from(ENTRY_POINTS[:3]))
        statement = f"{taught} = {value}\n{entry}(*inputs, g_cache={taught})"
    elif kind == 15:
        statement = f"with {torch.attr('no_grad')}():\n    {target} = {value}"
    elif kind == 16:
        statement = f"return {{'{key}': {value}}}" if in_method else f"{target} = {value}"
    elif kind == 18:
        statement = f"a = {target} = {value}"
    elif kind == 19:
        statement = f"({target}) = {value};"
    elif kind == 20:
        statement = f"[{target}, other] = [{value}, None]"
    elif kind == 21:
        statement = f"{target}[:] = {value}"
    elif kind == 22:
        statement = f"{target} += {value}"
    elif kind == 23:
        statement = f"make = lambda shape, dtype={draw(_dtype(torch))}: {value}"
    elif kind == 24:
        statement = (
            f"match state:\n    case {{'{key}': {key}}}:\n        {target} = {value}\n"
            f"    case [*_]:\n        pass"
        )
    elif kind == 25:
        dtype = draw(_dtype(torch))
        statement = f"{target} = {torch.attr('as_tensor')}(data, {dtype})"
    elif kind == 26:
        statement = f"{target} = {torch.attr('zeros')}(shape, **{{'dtype': {draw(_dtype(torch))}}})"
    else:
        statement = f"{target} = {value}"
    if draw(st.integers(0, 4)) == 0:
        first, _, rest = statement.partition("\n")
        statement = f"{first}  {draw(_comment())}" + (f"\n{rest}" if rest else "")
    return statement


def _indent(block: str, unit: str) -> str:
    """Indent every line of ``block`` that starts a logical line; continuation lines inside
    brackets may keep any indentation, so indenting them too stays valid."""
    return "\n".join(unit + line if line.strip() else line for line in block.split("\n"))


@st.composite
def _block(draw: st.DrawFn, torch: _Torch, unit: str) -> str:
    """A few statements, at module level or inside a function, method, class or control block."""
    container = draw(
        st.sampled_from(["module", "function", "method", "class_attr", "if", "try", "nested"])
    )
    in_method = container == "method"
    count = draw(st.integers(1, 4))
    body = "\n".join(draw(_statement(torch, in_method=in_method)) for _ in range(count))
    if container in {"module", "class_attr"}:
        body = "\n".join(line for line in body.split("\n") if not line.startswith("return "))
        body = body or "pass"
    decorator = draw(
        st.sampled_from(["", f"@{torch.attr('no_grad')}()\n", "@staticmethod\n", "@cache\n"])
    )
    annotations = draw(
        st.sampled_from(
            [
                "shape, dtype, device",
                "shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16, *, device=None",
                "shape, /, dtype=None, **factory_kwargs",
            ]
        )
    )
    if container == "module":
        return body
    if container == "function":
        name = draw(st.sampled_from(["make_rings", "restore", "snapshot", "__init__", "_ring"]))
        header = f"{decorator}def {name}({annotations}) -> None:"
        return f"{header}\n{_indent(body, unit)}"
    if container == "method":
        method_decorator = "" if decorator.startswith("@staticmethod") else decorator
        method = f"{method_decorator}def __init__(self, {annotations}):"
        inner = _indent(f"{method}\n{_indent(body, unit)}", unit)
        base = draw(st.sampled_from(["", "(torch.nn.Module)", "(Base, metaclass=Meta)"]))
        return f"class Pool{base}:\n{_indent(draw(_comment()), unit)}\n{inner}"
    if container == "class_attr":
        return f"class Rings:\n{_indent(body, unit)}"
    if container == "if":
        return f"if TYPE_CHECKING or flag:\n{_indent(body, unit)}\nelse:\n{unit}pass"
    if container == "try":
        return f"try:\n{_indent(body, unit)}\nexcept (OSError, KeyError) as error:\n{unit}raise"
    inner = f"async def step(self, {annotations}):\n{_indent(body, unit)}"
    return f"def outer():\n{_indent(inner, unit)}\n{unit}return step"


@st.composite
def gate_cache_programs(draw: st.DrawFn) -> Program:
    """A module of realistic gate-cache code laid out in odd but valid ways."""
    imports, torch = draw(st.sampled_from(_IMPORT_STYLES))
    unit = draw(st.sampled_from(["    ", "\t", "  ", " "]))
    header: list[str] = []
    if draw(st.booleans()):
        header.append(draw(st.sampled_from(['"""Gate rings."""', "'''doc'''", '"doc"; import os'])))
    if draw(st.booleans()):
        header.append("from __future__ import annotations")
    if draw(st.booleans()):
        header.append(draw(_comment()))
    if imports:
        header.append(imports)
    blocks = draw(st.lists(_block(torch, unit), min_size=1, max_size=4))
    separator = draw(st.sampled_from(["\n", "\n\n", "\n\n\n", "\n# between\n", "\n\x0c\n"]))
    source = "\n".join(header) + "\n" + separator.join(blocks)
    ending = draw(st.sampled_from(["\n", "", "\n\n", "  # trailing comment", "\n# last\n"]))
    source += ending
    newline = draw(st.sampled_from(["\n", "\n", "\r\n", "\r", "mixed"]))
    if newline == "mixed":  # every other line break CRLF
        lines = source.split("\n")
        source = (
            "".join(
                line + ("\r\n" if number % 2 else "\n") for number, line in enumerate(lines[:-1])
            )
            + lines[-1]
        )
    elif newline != "\n":
        source = source.replace("\n", newline)
    # A layout the pieces did not foresee: tell hypothesis, do not test it.
    assume(_compiles(source))
    return Program(source, newline)


@functools.cache
def grammar_programs() -> st.SearchStrategy[str]:
    """Programs hypothesmith derives from Python's grammar (valid for the running Python).

    One shared strategy: building it builds a grammar parser (seconds), so never per draw.
    """
    return hypothesmith.from_grammar()


def _compiles(source: str) -> bool:
    """A full compile: the parser alone accepts a misplaced ``from __future__`` import."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(source, "<fuzz>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
    return True


_FUTURE = re.compile(r"^\s*from\s+__future__\b", re.MULTILINE)
# The line breaks of Python's tokenizer (statement rows count these, not str.splitlines's).
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _row_starts(source: str) -> list[int]:
    return [0] + [match.end() for match in _LINE_BREAK.finditer(source)]


def _safe_split_rows(source: str) -> list[int]:
    """1-based rows before which a new top-level statement may be inserted: the first row of each
    top-level statement that does not share a row with the previous statement."""
    tree = ast.parse(source)
    rows: list[int] = []
    previous_end = 0
    for statement in tree.body:
        if statement.lineno > previous_end:
            rows.append(statement.lineno)
        previous_end = statement.end_lineno or statement.lineno
    return rows


@st.composite
def spliced_programs(draw: st.DrawFn, base: st.SearchStrategy[str] | None = None) -> Program:
    """A hypothesmith program with gate-cache statements spliced in between its statements."""
    program = draw(base if base is not None else grammar_programs())
    imports, torch = draw(st.sampled_from(_IMPORT_STYLES))
    statements = draw(st.lists(_statement(torch, in_method=False), min_size=1, max_size=3))
    snippet = "\n".join(
        line for line in "\n".join(statements).split("\n") if not line.startswith("return ")
    )
    snippet = "\n".join(filter(None, [imports, snippet])) or "pass"
    try:
        rows = _safe_split_rows(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        assume(False)
        raise AssertionError("unreachable") from None
    if _FUTURE.search(program):  # statements may not precede a __future__ import
        rows = []
    starts = _row_starts(program)
    choice = draw(st.sampled_from([*rows, None]))  # None: after the last statement
    if choice is None:
        lead = "" if program == "" or program.endswith(("\n", "\r")) else "\n"
        source = f"{program}{lead}{snippet}\n"
    else:
        offset = starts[choice - 1]
        source = f"{program[:offset]}{snippet}\n{program[offset:]}"
    assume(_compiles(source))
    return Program(source, "\n")
