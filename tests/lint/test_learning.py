"""Gate-cache names learned from decode call sites: the first pass, the library API, the CLI."""

from __future__ import annotations

import io
import sys
import textwrap
from pathlib import Path

import pytest

from replaylint.cli import main
from replaylint.lint.config.settings import Settings
from replaylint.lint.engine import Linter
from replaylint.lint.gatecache.entry_points import DEFAULT_ENTRY_POINTS, EntryPoint
from replaylint.lint.gatecache.learning import TOO_GENERIC_TO_LEARN, learn_gate_cache_names
from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom

POOL = textwrap.dedent(
    """
    import torch

    class DecayPool:
        def __init__(self, shape, dtype):
            self.delta_ring = torch.zeros(shape, dtype=dtype)
            self.decay_ring = torch.zeros(shape, dtype=dtype)
    """
).lstrip()

STEP = textwrap.dedent(
    """
    from kernels import ops

    def step(pool, inputs):
        return ops.kda_replayssm_decode(**inputs, d_cache=pool.delta_ring, g_cache=pool.decay_ring)
    """
).lstrip()


def _learn(
    *texts: str, entry_points: tuple[EntryPoint, ...] = DEFAULT_ENTRY_POINTS
) -> dict[str, int]:
    sources = [(f"f{i}.py", text) for i, text in enumerate(texts)]
    learned = learn_gate_cache_names(sources, entry_points, GateCacheNames())
    return {name: origin.row for name, origin in learned.items()}


@pytest.mark.parametrize(
    ("argument", "name"),
    [
        ("decay_ring", "decay_ring"),
        ("self.decay_ring", "decay_ring"),
        ("pool.decay_ring[layer]", "decay_ring"),
        ('caches["decay_ring"]', "decay_ring"),
        ("self.decay_ring[layer].contiguous()", "decay_ring"),
    ],
)
def test_the_gate_argument_teaches_its_name(argument: str, name: str) -> None:
    assert _learn(f"kda_replayssm_decode(x, g_cache={argument})\n") == {name: 1}


def test_the_tenth_positional_argument_is_the_gate_cache() -> None:
    call = "fused_replayssm_decode(q, a, b, A, dt, s, h0, d, k, decay_ring, out)\n"
    assert _learn(call) == {"decay_ring": 1}
    # with a star before it, the position is unknown: nothing is learned
    assert _learn("fused_replayssm_decode(*args, decay_ring, out)\n") == {}


@pytest.mark.parametrize(
    "spread",
    [
        "args = (q, a, b, A, dt)\n",
        "args = [q, a, b, A, dt]\n",
        "sizes = [1, 2, 3, 4, 5]\nargs = [torch.randn(s) for s in sizes]\n",
        "args = tuple(torch.randn(s) for s in (1, 2, 3, 4, 5))\n",
        "first = (q, a, b, A, dt)\nargs = first\n",
    ],
)
def test_a_spread_of_a_sequence_the_module_sizes_keeps_the_places_after_it(spread: str) -> None:
    call = "fused_replayssm_decode(*args, s, h0, d, k, decay_ring, out)\n"
    assert _learn(spread + call) == {"decay_ring": spread.count("\n") + 1}


@pytest.mark.parametrize(
    "spread",
    [
        "args = (q, a, b, A, dt)\nargs = args + (s,)\n",  # bound twice
        "args = [x for x in inputs if x is not None]\n",  # filtered
        "args = (*head, q)\n",  # a spread inside
        "def step(args):\n    pass\nargs = (q, a, b, A, dt)\n",  # also a parameter
        "for args in batches:\n    pass\n",
    ],
)
def test_a_spread_of_unknown_length_teaches_nothing_after_it(spread: str) -> None:
    assert _learn(spread + "fused_replayssm_decode(*args, s, h0, d, k, decay_ring, out)\n") == {}


def test_a_spread_that_covers_the_gate_place_teaches_nothing() -> None:
    # the spread itself passes the tenth argument: nothing written here is the gate ring
    spread = "args = (q, a, b, A, dt, s, h0, d, k, g)\n"
    assert _learn(spread + "fused_replayssm_decode(*args, decay_ring, out)\n") == {}


def test_a_tensor_passed_as_another_ring_too_is_not_learned() -> None:
    # one scratch ring for the d, k and g rings: not a gate cache by name
    call = "fused_replayssm_decode(q, a, b, A, dt, s, h0, scratch, scratch, scratch, out)\n"
    assert _learn(call) == {}
    assert _learn("kda_replayssm_decode(d_cache=pool.scratch, g_cache=pool.scratch)\n") == {}
    assert _learn("kda_replayssm_decode(d_cache=pool.d_ring, g_cache=pool.decay_ring)\n") == {
        "decay_ring": 1
    }


def test_generic_and_known_names_are_not_learned() -> None:
    assert "g" in TOO_GENERIC_TO_LEARN
    assert _learn("kda_replayssm_decode(g_cache=g)\nkda_replayssm_decode(g_cache=buf)\n") == {}
    # already a gate cache by the default patterns: nothing to teach
    assert _learn("kda_replayssm_decode(g_cache=replayssm_g)\n") == {}


def test_aliases_and_configured_entry_points() -> None:
    aliased = "from kernels import kda_replayssm_decode as decode\ndecode(g_cache=decay_ring)\n"
    assert _learn(aliased) == {"decay_ring": 2}
    custom = (EntryPoint("my_kda_step", "gates", 2),)
    assert _learn("my_kda_step(q, k, decay_ring)\n", entry_points=custom) == {"decay_ring": 1}
    assert _learn("my_kda_step(q, k, v, gates=ring_g)\n", entry_points=custom) == {"ring_g": 1}
    assert _learn("other_step(q, k, decay_ring)\n", entry_points=custom) == {}


def test_files_without_an_entry_point_are_not_parsed() -> None:
    # The pre-filter skips text without "replayssm_decode": a syntax error there is never seen,
    # and one in a file that does mention it is skipped rather than raised.
    assert _learn("def broken(:\n", "kda_replayssm_decode(g_cache=decay_ring\n") == {}


def test_a_learned_name_also_names_its_qualified_variants() -> None:
    origin = LearnedFrom("a.py", 2, "kda_replayssm_decode")
    names = GateCacheNames().with_learned({"decay_ring": origin})
    assert [names.matches(n) for n in ("decay_ring", "pad_decay_ring", "spec_decay_rings")] == [
        True,
        True,
        True,
    ]
    assert not any(names.matches(n) for n in ("decay_ring_pad", "paddecay_ring", "delta_ring"))
    assert names.learned_from("pad_decay_ring") == origin


def test_a_learned_name_also_names_its_plural_and_itself_with_a_ring_word() -> None:
    origin = LearnedFrom("a.py", 2, "kda_replayssm_decode")
    names = GateCacheNames().with_learned({"alpha_log": origin, "log_alpha_ring": origin})
    variants = ("alpha_logs", "alpha_log_ring", "alpha_log_bufs", "log_alpha_rings")
    assert all(names.matches(n) for n in variants)
    assert not any(names.matches(n) for n in ("alpha_log_state", "alpha_logx", "log_alpha"))
    assert names.learned_from("alpha_log_ring") == origin


def test_the_first_call_that_teaches_a_name_is_remembered() -> None:
    learned = learn_gate_cache_names(
        [("a.py", "x = 1\nkda_replayssm_decode(g_cache=decay_ring)\n"),
         ("b.py", "kda_replayssm_decode(g_cache=decay_ring)\n")],
        DEFAULT_ENTRY_POINTS,
    )  # fmt: skip
    assert learned["decay_ring"].describe() == (
        "passed as the gate cache of `kda_replayssm_decode` at a.py:2"
    )


def test_library_two_passes_find_a_renamed_gate_ring() -> None:
    linter = Linter(Settings(select=("RL002",)))
    assert linter.check(POOL, "pool.py") == []
    linter.learn([("pool.py", POOL), ("step.py", STEP)])
    findings = linter.check(POOL, "pool.py")
    assert [(f.location.row, f.code) for f in findings] == [(6, "RL002")]
    assert (
        "`self.decay_ring` (passed as the gate cache of `ops.kda_replayssm_decode` at step.py:4)"
        in (findings[0].message)
    )
    # the d ring was passed too, but as d_cache: it stays an ordinary tensor
    assert all("delta_ring" not in f.message for f in findings)


def test_command_line_learns_across_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pool.py").write_text(POOL)
    (tmp_path / "step.py").write_text(STEP)
    monkeypatch.chdir(tmp_path)
    assert main(["--output-format", "concise", "pool.py"]) == 0  # alone: nothing taught it
    capsys.readouterr()
    assert main(["--output-format", "concise", "pool.py", "step.py"]) == 1
    out = capsys.readouterr().out
    assert "pool.py:6:" in out
    assert "RL002" in out
    assert "step.py:4" in out


def test_stdin_learns_from_its_own_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    both = POOL + "\n\n" + STEP.replace("from kernels import ops\n", "")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(both.encode())))
    assert main(["-", "--output-format", "concise", "--stdin-filename", "pool.py"]) == 1
    out = capsys.readouterr().out
    assert "RL002" in out
    assert "passed as the gate cache" in out


SHARED_POOL = textwrap.dedent(
    """
    import torch

    def _ring(shape, dtype):
        return torch.zeros(shape, dtype=dtype)

    class DecayPool:
        def __init__(self, shape, dtype):
            self.delta_ring = _ring(shape, dtype)
            self.decay_ring = _ring(shape, dtype)
            for name in ("delta_ring", "decay_ring"):
                setattr(self, name + "_copy", torch.zeros(shape, dtype=dtype))
    """
).lstrip()


def test_every_rule_says_which_call_taught_a_learned_name() -> None:
    linter = Linter(Settings())
    linter.learn([("pool.py", SHARED_POOL), ("step.py", STEP)])
    findings = linter.check(SHARED_POOL, "pool.py")
    by_code = {finding.code: finding.message for finding in findings}
    assert "RL006" in by_code, findings
    for code, message in by_code.items():
        assert "passed as the gate cache of `ops.kda_replayssm_decode` at step.py:4" in message, (
            code,
            message,
        )


# --------------------------------------------------------------- wrappers, records and mappings
@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("layer(x, g_cache=cache.log_alpha)\n", "log_alpha"),  # a wrapper of the entry point
        ("ReplayBuffers(d_cache=d, k_cache=k, g_cache=decay_rows)\n", "decay_rows"),  # a record
        ('inputs = {"d_cache": d, "g_cache": cache.log_alpha}\n', "log_alpha"),  # **kwargs
        ("step(x, gate_cache=self.alpha_ring)\n", "alpha_ring"),  # any gate-cache keyword
    ],
)
def test_a_value_passed_for_a_gate_cache_keyword_or_key_teaches_its_name(
    source: str, name: str
) -> None:
    learned = learn_gate_cache_names([("m.py", source)], DEFAULT_ENTRY_POINTS)
    assert list(learned) == [name]


def test_a_keyword_or_key_that_passes_another_ring_too_teaches_nothing() -> None:
    sources = [
        ("m.py", "step(x, d_cache=scratch, g_cache=scratch)\n"),
        ("n.py", '{"k_cache": ring, "g_cache": ring}\n'),
    ]
    assert learn_gate_cache_names(sources, DEFAULT_ENTRY_POINTS) == {}


def test_a_file_with_a_gate_cache_keyword_but_no_entry_point_is_read() -> None:
    # no `replayssm_decode` in the text: the gate-cache pattern's literal piece admits it
    learned = learn_gate_cache_names(
        [("m.py", "layer(x, g_cache=self.decay_ring)\n")], DEFAULT_ENTRY_POINTS
    )
    assert learned["decay_ring"].describe() == (
        "passed as the gate cache of `layer(g_cache=...)` at m.py:1"
    )


def test_a_learned_name_matches_its_variants_with_a_word_inside() -> None:
    names = GateCacheNames().with_learned({"alpha_buffer": LearnedFrom("m.py", 1, "f")})
    assert names.matches("alpha_move_buffer")
    assert names.matches("alpha_host_move_buffer")
    assert names.learned_from("alpha_move_buffer") == LearnedFrom("m.py", 1, "f")
    assert not names.matches("alpha_buffering")
    assert not names.matches("beta_move_buffer")


def test_an_attribute_bound_to_the_entry_point_is_an_alias() -> None:
    source = textwrap.dedent(
        """
        from kernels import ops

        class Layer:
            def __init__(self):
                self.decode_op = ops.kda_replayssm_decode

            def forward(self, q, k, v, a, b, s, idx, d, kk):
                return self.decode_op(q, k, v, a, b, s, idx, d, kk, self.decay_rows)
        """
    ).lstrip()
    assert _learn(source) == {"decay_rows": 8}


def test_a_target_bound_to_two_callables_is_no_alias() -> None:
    source = textwrap.dedent(
        """
        from kernels import ops

        class Layer:
            def __init__(self, fast):
                self.decode_op = ops.kda_replayssm_decode
                if fast:
                    self.decode_op = ops.other_step

            def forward(self, q, k, v, a, b, s, idx, d, kk):
                return self.decode_op(q, k, v, a, b, s, idx, d, kk, self.decay_rows)
        """
    ).lstrip()
    assert _learn(source) == {}


@pytest.mark.parametrize(
    ("binding", "learned"),
    [
        ("d, kk, lam = self.d_buf, self.k_buf, self.forget_cache", {"lam", "forget_cache"}),
        ("lam = self.forget_cache.contiguous()", {"lam", "forget_cache"}),
        ('lam = rings["forget_cache"]', {"lam", "forget_cache"}),
        ("lam = rings[2]", {"lam"}),  # a place in a list names the list, not the ring
        ("lam = self.d_buf", set()),  # the d ring is passed too: it names no gate ring
    ],
)
def test_a_passed_local_also_teaches_the_name_it_was_taken_by(
    binding: str, learned: set[str]
) -> None:
    source = textwrap.dedent(
        f"""
        from kernels.ops import kda_replayssm_decode

        def step(self, rings, q, k, v, a, b, s, idx):
            d, kk = self.d_buf, self.k_buf
            {binding}
            return kda_replayssm_decode(q, k, v, a, b, s, idx, d, kk, lam)
        """
    ).lstrip()
    assert set(_learn(source)) == learned


def test_a_learned_name_matches_in_any_case_with_a_layer_index_or_a_path_before_it() -> None:
    origin = LearnedFrom("a.py", 2, "kda_replayssm_decode")
    names = GateCacheNames().with_learned({"decay_log": origin})
    forms = ("STATE_DECAY_LOG_0", "out_state_decay_log_1", "layers.0.decay_log", "decay_log_12")
    assert all(names.matches(n) for n in forms)
    assert all(names.learned_from(n) == origin for n in forms)
    # another word after the name, or a name that only contains a part of it, is another tensor
    assert not any(names.matches(n) for n in ("decay_log_scale", "decay_0", "STATE_DELTA_0"))
    # patterns number their rings too
    assert GateCacheNames().matches("g_cache_3")
    assert GateCacheNames().learned_from("layers.3.g_cache") is None


_ALIASED = """
import torch
from torch import nn


class StaticCache(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("log_decay_ring", torch.zeros(n, dtype=torch.float32))

{accessor}
"""


@pytest.mark.parametrize(
    "accessor",
    [
        "    @property\n    def g_cache(self):\n        return self.log_decay_ring",
        '    def g_cache(self):\n        """The gate ring."""\n        return self.log_decay_ring',
        "    g_cache = property(lambda self: self.log_decay_ring)",
    ],
)
def test_an_accessor_named_for_the_gate_cache_teaches_what_it_hands_out(accessor: str) -> None:
    learned = learn_gate_cache_names(
        [("cache.py", _ALIASED.format(accessor=accessor))], DEFAULT_ENTRY_POINTS, GateCacheNames()
    )
    assert list(learned) == ["log_decay_ring"]
    assert "returned by `StaticCache.g_cache`, named for the gate cache" in (
        learned["log_decay_ring"].describe()
    )


@pytest.mark.parametrize(
    "accessor",
    [
        # a conversion or a computation is a new tensor, not the buffer under another name
        "    @property\n    def g_cache(self):\n        return self.log_decay_ring.float()",
        "    def g_cache(self, layer):\n        return self.log_decay_ring",
        "    @property\n    def g_cache(self):\n        return self._cache.ring",
        # a name that is not the gate cache's hands out nothing of it
        "    @property\n    def decay(self):\n        return self.log_decay_ring",
        # too generic to mean the gate ring everywhere
        "    @property\n    def g_cache(self):\n        return self.buffer",
    ],
)
def test_other_accessors_teach_nothing(accessor: str) -> None:
    text = _ALIASED.format(accessor=accessor)
    assert (
        learn_gate_cache_names([("cache.py", text)], DEFAULT_ENTRY_POINTS, GateCacheNames()) == {}
    )


def test_every_default_name_has_its_qualified_form() -> None:
    # `padding_replayssm_g` beside `replayssm_g`, as `draft_gate_ring` beside `gate_ring`
    names = GateCacheNames()
    assert all(
        names.matches(f"padding_{base}")
        for base in ("g_cache", "gate_cache", "gate_ring", "replayssm_g")
    )
    assert not any(names.matches(n) for n in ("replayssm_gate_bias", "padding_replayssm_d"))


_RECORD = """
from typing import NamedTuple

import torch


class ReplayRings(NamedTuple):
    state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    write_pos: torch.Tensor

    @classmethod
    def from_cache(cls, c):
        return cls(c["ssm_state"], c["delta_mem"], c["key_mem"], c["log_forget"], c["write_pos"])


def rings_of(pool):
    return ReplayRings(pool.state, pool.delta, pool.key, pool.forget_ring, pool.pos)


def spread(parts):
    return ReplayRings(*parts)
"""


def test_a_record_filled_by_position_teaches_what_its_gate_field_is_given() -> None:
    learned = learn_gate_cache_names([("rings.py", _RECORD)], DEFAULT_ENTRY_POINTS)
    assert {name: origin.row for name, origin in learned.items()} == {
        "log_forget": 16,
        "forget_ring": 20,
    }
    assert learned["log_forget"].describe() == (
        "passed as the gate cache of `ReplayRings(g_cache=...)` at rings.py:16"
    )


def test_a_dtype_in_a_table_keyed_by_the_rings_is_no_ring() -> None:
    source = 'DTYPES = {"d_cache": torch.bfloat16, "g_cache": torch.float32}\n'
    assert learn_gate_cache_names([("m.py", source)], DEFAULT_ENTRY_POINTS) == {}


def test_what_a_learned_name_is_handed_is_learned_the_round_after() -> None:
    from replaylint.lint.gatecache.learning import learn_handed_names, parsed

    cache = parsed(
        textwrap.dedent(
            """
        class SlotCache:
            def layer_cache(self):
                return {"delta_mem": self.delta_buf, "log_forget": self.forget_buf}
        """
        ),
        "cache.py",
    )
    assert cache is not None
    known = GateCacheNames().with_learned({"log_forget": LearnedFrom("rings.py", 15, "f")})
    learned = learn_handed_names(cache, "cache.py", known)
    assert list(learned) == ["forget_buf"]
    assert learn_handed_names(cache, "cache.py", GateCacheNames()) == {}


def test_a_run_learns_through_a_record_and_the_mapping_that_fills_it(tmp_path: Path) -> None:
    from project_support import cli_rows, write_tree

    cache = """
    import torch


    class SlotCache(torch.nn.Module):
        def __init__(self, shape):
            super().__init__()
            self.register_buffer("forget_buf", torch.zeros(shape))

        def layer_cache(self):
            return {"ssm_state": None, "log_forget": self.forget_buf}
    """
    write_tree(tmp_path, {"pkg/__init__.py": "", "pkg/rings.py": _RECORD, "pkg/cache.py": cache})
    assert ("pkg/cache.py", 7, "RL003") in cli_rows(tmp_path, "--no-cache", "pkg")
