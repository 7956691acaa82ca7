"""Every failing example the fuzz tests found, kept as explicit tests.

Each test names the bug it pins down; the properties are the fuzz tests' own
(:mod:`fuzz_support`), plus the exact expected output where one is worth stating.
"""

from __future__ import annotations

import pytest
from fuzz_support import (
    assert_check_properties,
    assert_fix_properties,
    assert_prefilter_hides_nothing,
    changes_outside,
    python_compiles,
    time_limit,
)

from replaylint.lint.engine import Linter

BF16_GATE = "g_cache = torch.zeros(3, dtype=torch.bfloat16)\n"


def _all_properties(source: str) -> str | None:
    assert_check_properties(source)
    assert_prefilter_hides_nothing(source)
    assert_fix_properties(source)
    # Adding `import torch` to a module that did not import torch is an unsafe fix.
    return assert_fix_properties(source, unsafe=True)


# The pre-filter searched the lower-cased text and used the offsets in the original: "İ" lowers to
# two characters, so every "İ" before a gate-cache name shifted the offsets by one.
def test_prefilter_terminates_after_characters_that_lower_to_two() -> None:
    """Enough shift made the word search restart where it began: an endless loop."""
    source = "İ" * 36 + " = 1\nimport torch\n" + BF16_GATE
    with time_limit(5):
        assert [f.code for f in Linter().check(source, "x.py")] == ["RL001"]
    _all_properties(source)


def test_prefilter_keeps_finding_after_characters_that_lower_to_two() -> None:
    """A smaller shift made it read the wrong word and skip the file."""
    source = "# " + "İ" * 32 + "\nimport torch\nx = 1; " + BF16_GATE
    assert [f.code for f in Linter().check(source, "x.py")] == ["RL001"]
    assert_prefilter_hides_nothing(source)


# `import torch` added by a fix went before the first statement that is neither the docstring nor
# a __future__ import, found per line and from the statement's own start.
@pytest.mark.parametrize(
    ("source", "fixed"),
    [
        pytest.param(
            "from __future__ import annotations; import os\n" + BF16_GATE,
            "from __future__ import annotations; import torch; import os\n"
            + BF16_GATE.replace("bfloat16", "float32"),
            id="future-import-sharing-its-line",
        ),
        pytest.param(
            '"""Doc."""; from __future__ import annotations\n' + BF16_GATE,
            '"""Doc."""; from __future__ import annotations\nimport torch\n'
            + BF16_GATE.replace("bfloat16", "float32"),
            id="docstring-and-future-import-on-one-line",
        ),
        pytest.param(
            '"Implicitly " "concatenated."\nfrom __future__ import annotations\n' + BF16_GATE,
            '"Implicitly " "concatenated."\nfrom __future__ import annotations\nimport torch\n'
            + BF16_GATE.replace("bfloat16", "float32"),
            id="concatenated-docstring-before-future-import",
        ),
        pytest.param(
            '"""Doc."""; ' + BF16_GATE,
            '"""Doc."""; import torch; ' + BF16_GATE.replace("bfloat16", "float32"),
            id="docstring-sharing-its-line",
        ),
        pytest.param(
            "\n@torch.no_grad()\ndef make_rings(shape, dtype, device) -> None:\n"
            '    g_cache: torch.Tensor = torch.load(path)["g_cache"]\n',
            "\nimport torch\n@torch.no_grad()\ndef make_rings(shape, dtype, device) -> None:\n"
            '    g_cache: torch.Tensor = torch.load(path)["g_cache"].to(torch.float32)\n',
            id="decorated-first-statement",
        ),
        pytest.param(
            "@dataclass\nclass Pool:\n    " + BF16_GATE,
            "import torch\n@dataclass\nclass Pool:\n    "
            + BF16_GATE.replace("bfloat16", "float32"),
            id="decorated-first-class",
        ),
    ],
)
def test_added_import_keeps_the_module_valid(source: str, fixed: str) -> None:
    assert python_compiles(source)
    assert _all_properties(source) == fixed
    assert python_compiles(fixed)


def test_changes_outside_accepts_only_an_inline_import() -> None:
    """The property itself: a row outside the fixed statements may only gain ``import x; ``."""
    before = "from __future__ import annotations; import os\nx = 1\n"
    assert changes_outside(before, before.replace("os", "torch; import os"), set()) == []
    assert changes_outside(before, before.replace("x = 1", "x = 2"), set()) != []
    assert changes_outside(before, before.replace("x = 1", "x = 2"), {2}) == []


def test_a_name_bound_only_to_none_is_not_taken_for_torch() -> None:
    """``[g_cache, other] = [th.full(...), None]``: ``other`` is no alias of torch."""
    source = "\nimport torch as th\nclass Pool:\n    [g_cache, other] = [th.full(shape, 0.0), None]  # \n"
    fixed = _all_properties(source)
    assert fixed is not None
    assert "dtype=th.float32" in fixed
