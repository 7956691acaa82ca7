"""A fix that adds a line of its own: the gate cache unpacked from a shared-dtype comprehension is
made again, float32, on the next line, indented like the statement, whatever follows it."""

from __future__ import annotations

import pytest

from replaylint.lint import Linter
from replaylint.lint.model import Applicability

_UNPACK = "d_cache, k_cache, g_cache = (torch.zeros(s, dtype=dtype) for s in shapes)"
_AGAIN = "g_cache = torch.zeros_like(g_cache, dtype=torch.float32)"


def _fix(source: str) -> str:
    return Linter().fix(source, "m.py", unsafe=True).source


def test_the_line_goes_after_the_statement_and_its_comment_stays() -> None:
    source = (
        "import torch\n\ndef make(shapes, dtype):\n"
        f"    {_UNPACK}  # noqa: E501\n    return g_cache\n"
    )
    assert _fix(source) == (
        "import torch\n\ndef make(shapes, dtype):\n"
        f"    {_UNPACK}  # noqa: E501\n    {_AGAIN}\n    return g_cache\n"
    )


def test_a_statement_on_several_lines_gets_the_line_after_its_last() -> None:
    source = (
        "import torch\n\nif True:\n"
        "    d_cache, k_cache, g_cache = [\n"
        "        torch.empty(s, dtype=dtype, device=dev) for s in shapes\n"
        "    ]\n"
        "print(g_cache)\n"
    )
    assert _fix(source) == source.replace(
        "    ]\n", "    ]\n    g_cache = torch.empty_like(g_cache, dtype=torch.float32)\n"
    )


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_the_last_line_of_a_file_without_a_line_break(newline: str) -> None:
    source = f"import torch{newline}{_UNPACK}"
    assert _fix(source) == f"import torch{newline}{_UNPACK}{newline}{_AGAIN}{newline}"


def test_the_fix_is_unsafe_and_converges() -> None:
    source = f"import torch\n{_UNPACK}\n"
    fixes = [f.fix for f in Linter().check(source, "m.py") if f.fix is not None]
    assert [fix.applicability for fix in fixes] == [Applicability.UNSAFE]
    assert Linter().fix(source, "m.py").source == source
    fixed = _fix(source)
    assert Linter().check(fixed, "m.py") == []
    assert _fix(fixed) == fixed


def test_a_ring_cast_after_the_unpacking_is_no_reallocation() -> None:
    # `.to(float32)` of a bf16 ring is not the fix's line: the unpacking is still reported
    source = f"import torch\n{_UNPACK}\ng_cache = g_cache.to(torch.float32)\n"
    assert [f.code for f in Linter().check(source, "m.py")] == ["RL006"]


def test_an_allocation_with_more_than_size_dtype_and_device_is_not_made_again() -> None:
    # `zeros_like` would not pin the gate ring again: the comprehension is numbered instead
    source = (
        "import torch\n\ndef allocate(shapes, dtype):\n"
        "    d_cache, k_cache, g_cache = [\n"
        "        torch.zeros(shape, dtype=dtype, pin_memory=True) for shape in shapes\n"
        "    ]\n    return g_cache\n"
    )
    findings = Linter().check(source, "m.py")
    assert [f.code for f in findings] == ["RL006"]
    fixed = Linter().fix(source, "m.py").source
    assert "zeros_like" not in fixed
    assert (
        "torch.zeros(shape, dtype=torch.float32 if position == 2 else dtype, pin_memory=True)"
        " for position, shape in enumerate(shapes)"
    ) in fixed
