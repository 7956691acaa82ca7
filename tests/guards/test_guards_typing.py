"""Static typing: mypy sees a guarded function's own parameters and return type (ParamSpec)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
mypy_api = pytest.importorskip("mypy.api")

REPO = Path(__file__).resolve().parents[2]

SNIPPET = textwrap.dedent(
    """
    from typing import reveal_type

    import torch
    from replaylint.guards import fp32_gate_cache, require_dtypes

    @fp32_gate_cache
    def step(x: int, g_cache: torch.Tensor, *, flag: bool = False) -> str:
        return ""

    class Ring:
        @fp32_gate_cache(policy="cast")
        def method(self, g_cache: torch.Tensor) -> bytes:
            return b""

        @staticmethod
        @fp32_gate_cache
        def static_under(g_cache: torch.Tensor) -> float:
            return 1.0

        @fp32_gate_cache
        @staticmethod
        def static_over(g_cache: torch.Tensor) -> float:
            return 1.0

        @fp32_gate_cache
        @classmethod
        def class_over(cls, g_cache: torch.Tensor) -> int:
            return 1

    reveal_type(step)
    reveal_type(Ring().method)
    reveal_type(Ring.static_under)
    reveal_type(Ring.static_over)
    reveal_type(Ring.class_over)
    reveal_type(require_dtypes(g_cache=torch.float32, policy="warn")(step))
    step("one", torch.zeros(1))
    step(1, torch.zeros(1), flag=1.5)
    Ring().method()
    fp32_gate_cache(policy="strict")
    """
)

EXPECTED = [
    'note: Revealed type is "def (x: int, g_cache: Any, *, flag: bool =) -> str"',
    'note: Revealed type is "def (g_cache: Any) -> bytes"',
    'note: Revealed type is "def (g_cache: Any) -> float"',
    'note: Revealed type is "def (g_cache: Any) -> float"',
    'note: Revealed type is "def (g_cache: Any) -> int"',
    'note: Revealed type is "def (x: int, g_cache: Any, *, flag: bool =) -> str"',
    'error: Argument 1 to "step" has incompatible type "str"; expected "int"  [arg-type]',
    'error: Argument "flag" to "step" has incompatible type "float"; expected "bool"  [arg-type]',
    'error: Missing positional argument "g_cache" in call to "method" of "Ring"  [call-arg]',
    'error: No overload variant of "fp32_gate_cache" matches argument type "str"  [call-overload]',
]

# torch itself is not analysed (it would take minutes from a cold cache): its names become Any.
# replaylint's own modules are analysed silently; `mypy replaylint` checks them in CI.
CONFIG = """
[mypy]
strict = True
python_version = 3.11

[mypy-torch.*]
follow_imports = skip
follow_imports_for_stubs = True

[mypy-replaylint.*]
follow_imports = silent
"""


def test_mypy_sees_the_original_signatures(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG)
    stdout, stderr, status = mypy_api.run(
        [
            "--config-file", str(config),
            "--cache-dir", str(tmp_path / "cache"),
            "--no-error-summary",
            "--hide-error-context",
            str(snippet),
        ]
    )  # fmt: skip
    # Older mypy versions spell builtins as "builtins.int"; compare without the module.
    lines = [
        line.split(": ", 1)[1].replace("builtins.", "")
        for line in stdout.splitlines()
        if line.startswith(str(snippet))
    ]
    assert status == 1, stdout + stderr
    for expected in EXPECTED:
        assert expected in lines, f"missing {expected!r} in:\n" + "\n".join(lines)
    unexpected = [line for line in lines if line.startswith("error:") and line not in EXPECTED]
    assert unexpected == []
