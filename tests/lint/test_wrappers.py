"""Gate rings learned through the project's own wrappers of the decode kernel
(``gatecache/wrappers.py``): op wrappers, methods, custom ops and records of the rings, called
with the ring in the gate ring's place under another name."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Any

import pytest
from project_support import write_tree

from replaylint.lint.gatecache.entry_points import DEFAULT_ENTRY_POINTS
from replaylint.lint.gatecache.learning import learn_gate_cache_names, learnable
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom
from replaylint.lint.gatecache.wrappers import (
    Wrapper,
    learned_from_wrappers,
    names_passed_to,
    wrappers_in,
)


def _wrappers(source: str, names: GateCacheNames | None = None) -> list[Wrapper]:
    tree = ast.parse(textwrap.dedent(source))
    return list(wrappers_in(tree, names or GateCacheNames(), DEFAULT_ENTRY_POINTS, {}))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # a parameter named for the gate ring
        ("def kda_step(x, state, d, k, g_cache): ...", [Wrapper("kda_step", "g_cache", 4)]),
        # a parameter the body hands to the decode kernel as its gate cache
        (
            "def step(x, ring_d, ring_k, forget):\n    kda_replayssm_decode(x, *p, g_cache=forget)",
            [Wrapper("step", "forget", 3)],
        ),
        # a method: `self` is not among a call's arguments
        (
            "class Layer:\n    def decode(self, x, g_cache): ...",
            [Wrapper("decode", "g_cache", 1)],
        ),
        ("class Pool:\n    def __init__(self, n, g_cache): ...", [Wrapper("Pool", "g_cache", 1)]),
        ("def decode(x, *, g_cache): ...", [Wrapper("decode", "g_cache", None)]),
        # registered as a custom op: called by the op's name too
        (
            '@torch.library.custom_op("kda::step", mutates_args=())\n'
            "def _step_impl(x, g_cache): ...",
            [Wrapper("_step_impl", "g_cache", 1), Wrapper("step", "g_cache", 1)],
        ),
        # records of the rings, filled by position
        (
            "class Rings(NamedTuple):\n    d_cache: Tensor\n    k_cache: Tensor\n"
            "    g_cache: Tensor",
            [Wrapper("Rings", "g_cache", 2)],
        ),
        (
            "@dataclass\nclass Rings:\n    LEN: ClassVar[int] = 4\n    d: Tensor\n"
            "    g_cache: Tensor",
            [Wrapper("Rings", "g_cache", 1)],
        ),
        # a list of rings is not the ring; other parameters are no wrapper
        ("def decode(x, g_caches): ...", []),
        ("def decode(x, gate): ...", []),
        ("class Plain:\n    d: Tensor\n    g_cache: Tensor", []),
    ],
)
def test_wrappers_a_module_defines(source: str, expected: list[Wrapper]) -> None:
    assert _wrappers(source) == expected


def test_the_argument_in_the_gate_ring_place_is_learned_by_position_or_keyword() -> None:
    source = textwrap.dedent(
        """
        kda_step(x, state, self.delta_ring, self.key_ring, self.forget_ring)
        ops.kda_step(x, state, d, k, g_cache=cache.lg_buffer.contiguous())
        kda_step(*args)
        kda_step(x, state, ring, ring, ring)
        """
    )
    wrappers = {"kda_step": Wrapper("kda_step", "g_cache", 4)}
    learned = dict(names_passed_to(ast.parse(source), "m.py", wrappers))
    assert sorted(learned) == ["forget_ring", "lg_buffer"]
    assert learned["forget_ring"].describe() == "passed as `g_cache` of `kda_step`"


def _write(root: Path, files: dict[str, str]) -> list[str]:
    return [str(path) for path in write_tree(root, files)]


def _learned(paths: list[str]) -> list[str]:
    base = GateCacheNames()
    learned = learned_from_wrappers(
        paths,
        base,
        DEFAULT_ENTRY_POINTS,
        lambda path: Path(path).read_text(encoding="utf-8"),
        lambda name: learnable(name, base),
    )
    return sorted(learned)


def test_wrappers_of_wrappers_teach_across_modules(tmp_path: Path) -> None:
    paths = _write(
        tmp_path,
        {
            "ops.py": """
                def kda_step(x, state, d, k, g_cache):
                    return kda_replayssm_decode(x, *range(5), state, d, k, g_cache)
            """,
            "layer.py": """
                from ops import kda_step

                class Attention:
                    def decode_rings(self, x, state, d, k, forget_cache):
                        return kda_step(x, state, d, k, forget_cache)
            """,
            "model.py": """
                def run(attn, x, cache):
                    return attn.decode_rings(x, cache.state, cache.d_ring, cache.k_ring, cache.la_ring)
            """,
        },
    )
    assert _learned(paths) == ["forget_cache", "la_ring"]


def test_two_definitions_that_disagree_teach_nothing(tmp_path: Path) -> None:
    paths = _write(
        tmp_path,
        {
            "a.py": "def step(x, g_cache): ...\n",
            "b.py": "def step(g_cache, x): ...\n",
            "c.py": "step(first_ring, second_ring)\n",
        },
    )
    assert _learned(paths) == []


def test_the_command_line_reports_a_ring_only_a_wrapper_call_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from replaylint.cli import main

    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/ops.py": """
                def kda_step(x, state, d, k, g_cache):
                    return kda_replayssm_decode(x, *range(5), state, d, k, g_cache)
            """,
            "pkg/engine.py": """
                import torch
                from .ops import kda_step

                class Engine:
                    def __init__(self, shape, dtype):
                        self.delta = torch.zeros(shape, dtype=dtype)
                        self.keys = torch.zeros(shape, dtype=dtype)
                        self.forget = torch.zeros(shape, dtype=dtype)

                    def step(self, x, state):
                        return kda_step(x, state, self.delta, self.keys, self.forget)
            """,
        },
    )
    argv = ["check", "--isolated", "--no-cache", "--output-format", "concise", str(tmp_path)]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "engine.py:8:" in out
    assert "RL002" in out
    assert "engine.py:6:" not in out


_OPS = (
    "def kda_step(x, state, d, k, g_cache):\n"
    "    return kda_replayssm_decode(x, *range(5), state, d, k, g_cache)\n"
)
_ENGINE = (
    "import torch\nfrom ops import kda_step\n\n"
    "forget = torch.zeros(4, dtype=torch.bfloat16)\n"
    "kda_step(x, state, delta, keys, forget)\n"
)


def test_a_run_with_no_changed_file_takes_the_wrappers_from_the_cache(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replaylint.cli import main
    from replaylint.lint.run import taught

    (project / "ops.py").write_text(_OPS, encoding="utf-8")
    (project / "engine.py").write_text(_ENGINE, encoding="utf-8")
    stages: list[int] = []
    original = taught.learned_from_wrappers

    def counted(*args: Any, **kwargs: Any) -> dict[str, LearnedFrom]:
        stages.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(taught, "learned_from_wrappers", counted)
    assert main(["check", "--output-format", "concise", "."]) == 1
    assert main(["check", "--output-format", "concise", "."]) == 1
    assert stages == [1]  # the second run found the stage's result in the cache
    (project / "engine.py").write_text(_ENGINE.replace("forget", "decay_log"), encoding="utf-8")
    assert main(["check", "--output-format", "concise", "."]) == 1
    assert stages == [1, 1]  # a changed file: the stage runs again and learns `decay_log`


def test_a_definition_taking_a_learned_name_is_a_wrapper_where_no_kernel_is_called(
    tmp_path: Path,
) -> None:
    paths = _write(
        tmp_path,
        {
            "decode.py": "kda_replayssm_decode(q, a, b, A, dt, s, h0, d, k, cache.log_alpha)\n",
            "cache.py": """
                class Cache:
                    @classmethod
                    def from_tensors(cls, state, log_alpha):
                        return cls(state, log_alpha)
            """,
            "restore.py": "cache = Cache.from_tensors(blob['state'], blob['alpha_rows'])\n",
        },
    )
    base = GateCacheNames()
    taught = learn_gate_cache_names(
        [(p, Path(p).read_text(encoding="utf-8")) for p in paths], DEFAULT_ENTRY_POINTS, base
    )
    assert sorted(taught) == ["log_alpha"]
    learned = learned_from_wrappers(
        paths,
        base.with_learned(taught),
        DEFAULT_ENTRY_POINTS,
        lambda path: Path(path).read_text(encoding="utf-8"),
        lambda name: learnable(name, base),
    )
    assert sorted(learned) == ["alpha_rows"]
