"""The server's projects resolve dtypes imported from other modules, as a command-line run does,
and see a saved policy module's new value."""

from __future__ import annotations

from pathlib import Path

from replaylint.server.project import ProjectIndex

POOL = (
    "import torch\n"
    "from .policy import GATE_RING_DTYPE\n"
    "g_cache = torch.zeros(4, 16, dtype=GATE_RING_DTYPE)\n"
)


def test_an_imported_policy_is_followed_and_a_save_is_seen(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.replaylint]\n", encoding="utf-8")
    package = tmp_path / "serving"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    policy = package / "policy.py"
    policy.write_text("import torch\nGATE_RING_DTYPE = torch.bfloat16\n", encoding="utf-8")
    pool = package / "pool.py"
    pool.write_text(POOL, encoding="utf-8")
    projects = ProjectIndex([tmp_path])

    report, _ = projects.project_for(pool).lint(pool, POOL)
    assert [(f.location.row, f.code) for f in report.findings] == [(3, "RL001")]
    assert "serving/policy.py:2" in report.findings[0].message

    policy.write_text("import torch\nGATE_RING_DTYPE = torch.float32\n", encoding="utf-8")
    projects.saved(policy)
    report, _ = projects.project_for(pool).lint(pool, POOL)
    assert report.findings == []


ENGINE = (
    "import torch\n"
    "from .ops import kda_step\n"
    "\n"
    "class Engine:\n"
    "    def __init__(self, shape, dtype):\n"
    "        self.forget = torch.zeros(shape, dtype=dtype)\n"
    "\n"
    "    def step(self, x, d, k):\n"
    "        return kda_step(x, d, k, self.forget)\n"
)


def test_a_ring_passed_to_a_wrapper_of_the_kernel_is_a_gate_cache(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.replaylint]\n", encoding="utf-8")
    package = tmp_path / "serving"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "ops.py").write_text(
        "def kda_step(x, d, k, forget_ring):\n"
        "    return kda_replayssm_decode(x, *range(6), d, k, g_cache=forget_ring)\n",
        encoding="utf-8",
    )
    engine = package / "engine.py"
    engine.write_text(ENGINE, encoding="utf-8")

    report, _ = ProjectIndex([tmp_path]).project_for(engine).lint(engine, ENGINE)
    assert [(f.location.row, f.code) for f in report.findings] == [(6, "RL002")]
