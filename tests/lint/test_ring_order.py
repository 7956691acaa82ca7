"""The gate ring by its place after the d and k rings (``gatecache/ring_order.py``), and other
ways a ring or a buffer is recognised without its name: buffers registered in a loop over ring
names, cast overrides that put saved buffers back, ``torch.tensor(data)``, dtype tables looked up
by a loop's cache name."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from project_support import cli_rows, lint_in_project, write_tree

from replaylint.lint.config.settings import Settings
from replaylint.lint.engine import Linter
from replaylint.lint.gatecache.learning import learn_gate_cache_names
from replaylint.lint.gatecache.ring_order import gate_rings_by_order


def _ordered(source: str) -> list[str]:
    tree = ast.parse(textwrap.dedent(source))
    return sorted({name for name, _ in gate_rings_by_order(tree, "m.py")})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("self.d_states, self.k_states, self.decay_states = [], [], []", ["decay_states"]),
        ("return self.temp_d, self.temp_k, temp_decay", ["temp_decay"]),
        ('RINGS = ("cache_state", "cache_delta", "cache_key", "cache_gate")', ["cache_gate"]),
        ("chunk = Chunk(state, d_ring, k_ring, log_gate_ring, 0)", ["log_gate_ring"]),
        ("rows = [delta[i], key[i], alpha[i]]", ["alpha"]),
        ("state, ring_d, ring_k, ring_g = pool.rings(layer)", ["ring_g"]),
        # not a family: other words differ, metadata, generic third names, one-letter words alone
        ("dims = (d_model, k_dim, heads)", []),
        ("shapes = (d_shape, k_shape, g_shape)", []),
        ("x = (d_ring, k_ring, v_ring)", []),
        ("q, k, v = qkv.split(3)", []),
        ("rows = (d, k, g)", []),
        ("rows = (d, k, decay)", []),
        # one assignment under the other, in one block
        ("self.delta = make()\nself.key = make()\nself.log_alpha = make()", ["log_alpha"]),
        ("self.d_buf = a\nself.k_buf = b\nif x:\n    self.lg_buf = c", []),  # another block
        ("d_view = a\nk_view = b\ng_view = c", []),  # locals: views of one function
        ("d_proj = a\nk_proj = b\nv_proj = c", []),
        ("self.delta = a\nself.key = b\nself.value = c", []),
        # the kernel's order, checkpoint first and cursor last: the fourth is the gate ring
        ("state += [time_state, d_ring, k_ring, w_log, pos]", ["w_log"]),
        ("chunk = (ssm_state, delta, key, forget, write_pos)", ["forget"]),
        ("row = (state, d_ring, k_ring, beta, mask)", []),  # no cursor after it
        ("row = (weights, d_ring, k_ring, w_log, pos)", []),  # no checkpoint before it
        ("row = (state, d_ring, k_ring, scale, pos)", []),  # metadata, not a ring
    ],
)
def test_the_third_ring_of_a_family_is_the_gate_ring(source: str, expected: list[str]) -> None:
    assert _ordered(source) == expected


def test_learning_takes_the_ring_written_in_the_gate_place() -> None:
    source = textwrap.dedent(
        """
        def decode(cache, x):
            state, ring_d, ring_k, ring_g = cache.nc_state, cache.nc_d, cache.nc_k, cache.nc_decay
            fused_recurrent_kda_replayssm_decode(x, *range(5), state, ring_d, ring_k, ring_g)
        """
    )
    learned = learn_gate_cache_names([("m.py", source)], Settings().entry_points)
    assert {"ring_g", "nc_decay"} <= set(learned)
    assert "in the place of the gate ring" in learned["nc_decay"].reason


def test_a_ring_known_by_its_place_is_checked() -> None:
    source = textwrap.dedent(
        """
        import torch

        class Cache:
            def __init__(self, n):
                self.d_states, self.k_states, self.decay_states = [], [], []
                for _ in range(n):
                    self.decay_states.append(torch.zeros_like(self.d_states[-1]))

        def decode(cache, x, i):
            fused_recurrent_kda_replayssm_decode(
                x, *range(5), cache.d_states[i], cache.k_states[i], cache.decay_states[i]
            )
        """
    )
    linter = Linter()
    linter.learn([("m.py", source)])  # the first pass of a run
    findings = linter.check(source, "m.py")
    assert [(f.location.row, f.code) for f in findings] == [(8, "RL003")]


def test_a_buffer_registered_in_a_loop_over_ring_names_is_a_gate_buffer() -> None:
    source = textwrap.dedent(
        """
        import torch
        from torch import nn

        class Runner(nn.Module):
            def __init__(self, replay, n):
                super().__init__()
                for name in ("state", "d_cache", "k_cache", "g_cache"):
                    self.register_buffer(f"static_{name}", getattr(replay, name).clone())

        def capture(model, replay):
            return Runner(replay, 4).to(model.dtype)
        """
    )
    findings = Linter().check(source, "m.py")
    assert [(f.location.row, f.code) for f in findings] == [(12, "RL004")]
    assert "`static_g_cache`" in findings[0].message


_KEEPING = """
import torch
from torch import nn

class Buffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))

    def _apply(self, fn, recurse=True):
        kept = {"g_cache": self._buffers["g_cache"]}
        super()._apply(fn, recurse)
        for name, buffer in kept.items():
            self._buffers[name] = buffer.to(device=self._buffers[name].device)
        return self
"""


def test_an_override_that_puts_saved_buffers_back_keeps_them(tmp_path: Path) -> None:
    local = textwrap.dedent(_KEEPING) + "\n\nmodel = Buffers().to(torch.bfloat16)\n"
    assert Linter().check(local, "m.py") == []
    files = {
        "pkg/__init__.py": "",
        "pkg/buffers.py": _KEEPING,
        "pkg/serve.py": "import torch\nfrom .buffers import Buffers\n\nmodel = Buffers().half()\n",
    }
    assert lint_in_project(tmp_path, files, "pkg/serve.py") == []
    # without the override the cast is reported, in the module and across modules
    plain = _KEEPING.split("    def _apply")[0]
    files["pkg/buffers.py"] = plain
    assert [f.code for f in lint_in_project(tmp_path, files, "pkg/serve.py")] == ["RL004"]


def test_torch_tensor_of_data_takes_the_datas_dtype() -> None:
    source = textwrap.dedent(
        """
        import numpy as np
        import torch

        class Pool:
            def __init__(self, path, n):
                # a numpy array keeps its dtype; a Python list takes the default dtype
                self.g_cache = torch.tensor(np.load(path)).float()
                self.replayssm_g = torch.tensor([0.0] * n)
        """
    )
    findings = Linter().check(source, "m.py")
    assert [(f.location.row, f.code) for f in findings] == [(9, "RL003")]


def test_a_dtype_looked_up_by_the_cache_name_is_not_shared() -> None:
    source = textwrap.dedent(
        """
        import torch

        def host_copies(d, g, dtypes):
            rings = {"d_cache": d, "g_cache": g}
            return {name: torch.zeros_like(buf, dtype=dtypes[name]) for name, buf in rings.items()}

        def same_dtype(d, g, dtype):
            rings = {"d_cache": d, "g_cache": g}
            return {name: torch.zeros_like(buf, dtype=dtype) for name, buf in rings.items()}
        """
    )
    rows = [(f.location.row, f.code) for f in Linter().check(source, "m.py")]
    assert rows == [(10, "RL006")]


def test_a_getter_of_another_module_teaches_the_ring_it_returns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from replaylint.cli import main

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg" / "cache.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Cache:
                def __init__(self, layers, shape, dtype):
                    self.store, self.deltas, self.decays = [], [], []
                    for _ in range(layers):
                        self.deltas.append(torch.zeros(shape, dtype=dtype))
                        self.decays.append(torch.zeros_like(self.deltas[-1]))

                def rings(self, layer):
                    return self.store[layer], self.deltas[layer], self.decays[layer]
            """
        ),
        encoding="utf-8",
    )
    (tmp_path / "pkg" / "layer.py").write_text(
        textwrap.dedent(
            """
            def decode(cache, x, layer):
                state, ring_d, ring_g = cache.rings(layer)
                fused_recurrent_kda_replayssm_decode(x, *range(5), state, ring_d, x, g_cache=ring_g)
            """
        ),
        encoding="utf-8",
    )
    assert (
        main(["check", "--isolated", "--no-cache", "--output-format", "concise", str(tmp_path)])
        == 1
    )
    out = capsys.readouterr().out
    assert "cache.py:9:" in out
    assert "RL003" in out


def test_rings_appended_by_name_in_a_loop_over_zipped_names_share_one_dtype() -> None:
    source = textwrap.dedent(
        """
        import torch

        class Cache:
            def __init__(self, layers, dtype):
                self.d_cache, self.k_cache, self.g_cache = [], [], []
                rings = dict(zip(("d_cache", "k_cache", "g_cache"), self.shapes()))
                for _ in range(layers):
                    for attr, shape in rings.items():
                        getattr(self, attr).append(torch.zeros(shape, dtype=dtype))
        """
    )
    findings = Linter().check(source, "m.py")
    assert [(f.location.row, f.code) for f in findings] == [(10, "RL006")]
    assert "a loop over `rings.items()`" in findings[0].message


def test_a_module_that_only_names_its_rings_teaches_the_gate_ring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tuple of ring names (`RINGS = ("d_cache", "k_cache", "la_cache")`) teaches the one in
    the gate ring's place also in a module with no decode call; a slice of that tuple is a loop
    over the names it keeps."""
    from replaylint.cli import main

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg" / "engine.py").write_text(
        textwrap.dedent(
            """
            import torch

            RINGS = ("d_cache", "k_cache", "la_cache", "s_cache")

            class Cache:
                def insert(self, shapes, x):
                    self.la_cache = torch.zeros(shapes["la_cache"])  # the default dtype
                    return self.compiled_step.g_cache

                def half_(self):
                    for name in RINGS[:3]:
                        setattr(self, name, getattr(self, name).half())

                def half_states(self):
                    for name in RINGS[3:]:  # the state only: not a gate ring
                        setattr(self, name, getattr(self, name).half())
            """
        ),
        encoding="utf-8",
    )
    code = main(["check", "--isolated", "--no-cache", "--output-format", "concise", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    rows = sorted(line.split(":")[1] for line in out.splitlines() if "engine.py:" in line)
    assert rows == ["13", "8"]  # the default-dtype ring, the loop over `RINGS[:3]`
    assert "written after `d_cache` and `k_cache`" in out


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # the fields of a record, the keywords of a call, the keys of a dict: one-letter ring
        # words count there
        (
            "class Seed(NamedTuple):\n    d: Tensor\n    k: Tensor\n    decay: Tensor",
            ["decay"],
        ),
        ("seed = Seed(d=v, k=key, decay=g.contiguous())", ["decay"]),
        ('rings = {"state": s, "d": d, "k": k, "decay": g}', ["decay"]),
        # what else a state holds is never the gate ring
        ('rings = {"d": d, "k": k, "state": s}', []),
        ("seed = Seed(d=v, k=key, num_steps=3)", []),
        ("class Dims:\n    d: int\n    k: int\n    v: int", []),
        # a tuple of one-letter names is no declaration
        ("rows = (d, k, decay)", []),
    ],
)
def test_a_declaration_names_the_gate_ring_by_its_place(source: str, expected: list[str]) -> None:
    assert _ordered(source) == expected


def test_a_one_word_name_guessed_from_its_place_does_not_qualify() -> None:
    from replaylint.lint.gatecache.names import GateCacheNames, LearnedFrom

    guessed = LearnedFrom("m.py", 1, "", "written after `d` and `k`, in the place of the gate ring")
    names = GateCacheNames().with_learned({"decay": guessed})
    assert all(names.matches(name) for name in ("decay", "decays", "decay_ring"))
    assert not any(names.matches(name) for name in ("weight_decay", "neutral_decay"))
    # a name taught by a decode call qualifies as before
    taught = GateCacheNames().with_learned({"decay": LearnedFrom("m.py", 1, "decode")})
    assert taught.matches("weight_decay")


def test_data_made_for_a_file_is_not_a_ring() -> None:
    source = textwrap.dedent(
        """
        import torch

        def write_legacy(path, ring):
            torch.save({"g_cache": torch.full((2, 4), -0.125, dtype=torch.half)}, path)

        def write_cast(path, ring):
            torch.save({"g_cache": ring.half()}, path)

        def kept(ring):
            return {"g_cache": torch.full((2, 4), -0.125, dtype=torch.half)}
        """
    )
    rows = [(f.location.row, f.code) for f in Linter().check(source, "m.py")]
    assert rows == [(8, "RL004"), (11, "RL001")]


_KERNEL_CALLER = """
import torch


def fused_recurrent_kda_replayssm_decode(**kwargs):
    return kwargs


def step(pool, i):
    return fused_recurrent_kda_replayssm_decode(d_cache=pool.d_ring[i], g_cache=pool.w_log_ring[i])
"""

_TUNING = """
import torch


def load_state(sd, a):
    state = []
    for i in range(a.layers):
        time_state, pos = sd[f"{i}.time_state"], sd[f"{i}.pos"]
        d_ring, k_ring = sd[f"{i}.d_ring"], sd[f"{i}.k_ring"]
        w_log = d_ring.new_zeros(sd[f"{i}.w_log_ring"].shape)
        state += [time_state, d_ring, k_ring, w_log, pos]
    return state
"""


@pytest.mark.parametrize("cached", [False, True])
def test_a_file_that_names_a_learned_ring_teaches_the_rows_it_writes(
    tmp_path: Path, cached: bool
) -> None:
    files = {"pkg/__init__.py": "", "pkg/kernels.py": _KERNEL_CALLER, "pkg/tuning.py": _TUNING}
    write_tree(tmp_path, files)
    options = () if cached else ("--no-cache",)
    rows = cli_rows(tmp_path, *options)
    if cached:
        assert cli_rows(tmp_path) == rows  # the stage remembered in the cache: the same again
    assert ("pkg/tuning.py", 9, "RL003") in rows  # `w_log = d_ring.new_zeros(...)`


def test_a_ring_guessed_from_its_place_is_taught_by_a_decode_call_in_a_later_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``alpha_buffer`` written after the d and k rings is a guess; a later file's decode call
    that passes it as the gate cache is certain and wins, and only a certain name makes its
    variants gate caches (``alpha_move_buffer``, like the d ring's ``delta_move_buffer``)."""
    from replaylint.cli import main

    files = {
        "pkg/__init__.py": "",
        "pkg/a_pool.py": """
            import torch

            class Pool:
                \"\"\"The kernel's d_cache, k_cache and g_cache of every slot.\"\"\"

                def __init__(self, n, dtype):
                    self.delta_buffer = torch.zeros(n, dtype=dtype)
                    self.key_buffer = torch.zeros(n, dtype=dtype)
                    self.alpha_buffer = torch.zeros(n, dtype=torch.float32)

                def alloc_move_buffers(self):
                    self.delta_move_buffer = torch.empty_like(self.delta_buffer)
                    self.alpha_move_buffer = torch.empty_like(self.delta_move_buffer)
            """,
        "pkg/b_layer.py": """
            from kernels import fused_recurrent_kda_replayssm_decode

            def step(q, mem):
                return fused_recurrent_kda_replayssm_decode(
                    q, d_cache=mem.delta_buffer, k_cache=mem.key_buffer, g_cache=mem.alpha_buffer
                )
            """,
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    main(["check", "--isolated", "--no-cache", "--output-format", "concise", str(tmp_path)])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "a_pool.py:" in line]
    assert len(rows) == 1
    assert "a_pool.py:13:" in rows[0]
    assert "passed as the gate cache of `fused_recurrent_kda_replayssm_decode`" in rows[0]
