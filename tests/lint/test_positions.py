"""Finding positions computed for chosen nodes must be exactly libcst's whole-tree positions.

:class:`replaylint.lint.syntax.positions.NodePositions` replaces ``PositionProvider`` (spans) and
``ParentNodeProvider`` (the statement around a finding). Here every node of every corpus file is
located both ways and the answers must agree, span for span and row for row.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from replaylint.lint.rules.registry import ALL_RULES
from replaylint.lint.syntax.positions import NodePositions

ROOT = Path(__file__).resolve().parents[2]

_AWKWARD = {
    "crlf": "import torch\r\nx = (1,\r\n     2)\r\nif x:\r\n    y = 1\r\n",
    "bare-cr": "a = 1\rb = [\r  2]\r",
    "no-trailing-newline": "def f():\n    return g_cache",
    "empty": "",
    "comments-only": "# one\n\n# two\n",
    "semicolons": "a = 1; b = torch.zeros(2); c = 3\n",
    "decorators": "@d\n@e(1,\n   2)\n\nclass C:\n    @property\n    def p(self): return 1\n",
    "continuation": "x = 1 + \\\n    2\nif (a and\n        b): pass\n",
    "tabs-and-strings": 'def f():\n\tx = """a\r\nb"""\n\treturn f"{x!r:>{w}}"\n',
    "compound": textwrap.dedent(
        """
        for i in range(3):
            while i:
                try:
                    with open(p) as h, lock:
                        pass
                except (A, B) as e:
                    raise
                else:
                    i -= 1
                finally:
                    del i
        match v:
            case [1, *rest] if rest:
                pass
            case _:
                pass
        async def g(a, /, b=2, *c, d, **e) -> int:
            async with x: await y
            return (yield)
        """
    ),
}


def _corpus() -> list[tuple[str, str]]:
    texts = list(_AWKWARD.items())
    for rule in ALL_RULES:
        texts += [(f"{rule.CODE}-valid-{n}", v.source) for n, v in enumerate(rule.VALID)]
        texts += [(f"{rule.CODE}-invalid-{n}", v.source) for n, v in enumerate(rule.INVALID)]
    for folder in ("tests/lint/fixtures", "replaylint/lint"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            texts.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")))
    return texts


CORPUS = _corpus()


def _reference_rows(
    node: cst.CSTNode, positions: object, parents: object
) -> tuple[int, int] | None:
    """The statement rows as the engine computed them from libcst's parent metadata."""
    child = node
    while True:
        parent = parents.get(node)  # type: ignore[attr-defined]
        if parent is None:
            return None
        if isinstance(parent, cst.SimpleStatementLine):
            span = positions[parent]  # type: ignore[index]
            return span.start.line, span.end.line
        if isinstance(parent, cst.BaseCompoundStatement):
            start = positions[parent].start.line  # type: ignore[index]
            return start, max(start, positions[child].end.line)  # type: ignore[index]
        if isinstance(parent, cst.Module):
            span = positions[node]  # type: ignore[index]
            return span.start.line, span.end.line
        child, node = node, parent


@pytest.mark.parametrize(("name", "text"), CORPUS, ids=[name for name, _ in CORPUS])
def test_every_node_is_located_as_libcst_locates_it(name: str, text: str) -> None:
    module = cst.parse_module(text)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    expected = wrapper.resolve(PositionProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    nodes = [node for node in expected if node is not module]
    located = NodePositions(module)
    located.compute(nodes)
    for node in nodes:
        assert located.span(node) == expected[node], (name, type(node).__name__)
        rows = _reference_rows(node, expected, parents)
        assert rows is not None
        assert located.statement_rows(node) == rows, (name, type(node).__name__)


def test_nodes_asked_one_at_a_time_agree_with_one_batch() -> None:
    text = dict(CORPUS)["compound"]
    module = cst.parse_module(text)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    one_by_one = NodePositions(module)
    # The first renderings record only the nodes asked for, later ones every node.
    for node in list(expected)[1:40]:
        assert one_by_one.span(node) == expected[node]


def test_a_node_from_another_tree_is_an_error() -> None:
    module = cst.parse_module("x = 1\n")
    stranger = cst.parse_expression("y")
    with pytest.raises(KeyError, match="not part of the module"):
        NodePositions(module).span(stranger)


@pytest.mark.parametrize(("name", "text"), CORPUS, ids=[name for name, _ in CORPUS])
def test_rendering_from_a_later_statement_locates_the_same(name: str, text: str) -> None:
    # With the source, a rendering starts at the first top-level statement holding the nodes
    # asked for: ask about nodes all through the file, a few at a time, from fresh positions.
    module = cst.parse_module(text)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    expected = wrapper.resolve(PositionProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    nodes = [node for node in expected if node is not module]
    step = max(1, len(nodes) // 25)
    for start in range(0, len(nodes), step):
        asked = nodes[start : start + 2]
        located = NodePositions(module, text)
        located.compute(asked)
        for node in asked:
            assert located.span(node) == expected[node], (name, type(node).__name__)
            rows = _reference_rows(node, expected, parents)
            assert located.statement_rows(node) == rows, (name, type(node).__name__)


def test_text_that_is_not_the_modules_falls_back_to_a_full_rendering() -> None:
    text = "a = 1\nb = 2\nc = torch.zeros(3)\n"
    module = cst.parse_module(text)
    target = module.body[2]
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)[target]
    # The text must end as the module renders; here it does not, so the whole module is rendered.
    assert NodePositions(module, text + "# not the module's\n").span(target) == expected
    assert NodePositions(module, text.replace("c =", "cc =")).span(target) == expected
