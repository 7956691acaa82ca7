"""Records of the rings' dtypes that another module of the project defines: a construction that
gives the gate field a narrower literal is reported where it is written (and fixed there), and a
read of the field through an instance whose class is known trusts a float32 default, since every
construction that sets the field is checked where it is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from project_support import cli_rows, fix_in_project, lint_in_project, write_tree

from replaylint.lint.run.record_classes import record_class_names

_PRECISION = """
from dataclasses import dataclass

import torch

GATE_DTYPE = torch.float32


@dataclass(frozen=True)
class RingDtypes:
    delta: torch.dtype = torch.bfloat16
    key: torch.dtype = torch.bfloat16
    gate: torch.dtype = GATE_DTYPE


@dataclass(frozen=True)
class MoeDtypes:
    experts: torch.dtype = torch.bfloat16
    gate: torch.dtype = torch.bfloat16
"""

_POOL = """
import torch

from .precision import MoeDtypes, RingDtypes


class Pool:
    def __init__(self, shape, dtype, ring_dtypes: RingDtypes | None = None):
        self.ring_dtypes = ring_dtypes or RingDtypes(delta=dtype, key=dtype)
        dtypes = self.ring_dtypes
        self.d_cache = torch.zeros(shape, dtype=dtypes.delta)
        self.g_cache = torch.zeros(shape, dtype=dtypes.gate)


PRESETS = {
    "bf16": RingDtypes(delta=torch.bfloat16, key=torch.bfloat16),
    "fp16": RingDtypes(torch.float16, torch.float16, torch.float16),
}
ROUTER = MoeDtypes(torch.bfloat16, torch.bfloat16)  # a router's gate: no ring beside it
"""


def _files(pool: str = _POOL) -> dict[str, str]:
    return {"pkg/__init__.py": "", "pkg/precision.py": _PRECISION, "pkg/pool.py": pool}


def test_a_narrow_gate_field_of_an_imported_record_is_reported_and_fixed(tmp_path: Path) -> None:
    found = lint_in_project(tmp_path, _files(), "pkg/pool.py")
    assert [(f.location.row, f.code) for f in found] == [(16, "RL001")]
    assert (
        "`gate` of `RingDtypes`, the gate ring's dtype, is given torch.float16" in found[0].message
    )
    fixed = fix_in_project(tmp_path, _files(), "pkg/pool.py")
    assert '"fp16": RingDtypes(torch.float16, torch.float16, torch.float32),' in fixed
    assert "ROUTER = MoeDtypes(torch.bfloat16, torch.bfloat16)" in fixed


@pytest.mark.parametrize(
    "receiver",
    [
        "ring_dtypes",  # `RingDtypes | None`, read where it is given
        "self.ring_dtypes",
        "RingDtypes(delta=dtype, key=dtype)",
    ],
)
def test_a_float32_default_vouches_for_the_field_read_through_a_known_instance(
    tmp_path: Path, receiver: str
) -> None:
    pool = _POOL.replace("dtype=dtypes.gate", f"dtype=({receiver}).gate")
    assert [f.location.row for f in lint_in_project(tmp_path, _files(pool), "pkg/pool.py")] == [16]


def test_a_receiver_of_two_classes_stays_unknown(tmp_path: Path) -> None:
    pool = _POOL.replace(
        "ring_dtypes or RingDtypes(delta=dtype, key=dtype)", "ring_dtypes or MoeDtypes()"
    )
    rows = [
        (f.location.row, f.code) for f in lint_in_project(tmp_path, _files(pool), "pkg/pool.py")
    ]
    assert (11, "RL002") in rows


def test_a_run_over_the_tree_finds_the_construction_of_an_imported_record(
    tmp_path: Path,
) -> None:
    # the run lists the classes of files that mention a record first, and resolves only those
    user = (
        "import torch\n\nfrom .precision import RingDtypes\n\n\n"
        "def pool(shape):\n"
        "    dtypes = RingDtypes(delta=torch.bfloat16, key=torch.bfloat16, gate=torch.float16)\n"
        "    g_cache = torch.zeros(shape, dtype=dtypes.gate)\n"
        "    return g_cache\n"
    )
    files = {
        "pyproject.toml": "[tool.replaylint]\n",
        "pkg/__init__.py": "",
        "pkg/precision.py": _PRECISION,
        "pkg/user.py": user,
    }
    write_tree(tmp_path, files)
    assert ("pkg/user.py", 7, "RL001") in cli_rows(tmp_path, "--no-cache")


def test_the_record_classes_are_listed_from_the_files_that_mention_records(
    tmp_path: Path,
) -> None:
    write_tree(
        tmp_path,
        {
            "a.py": "from dataclasses import dataclass\n\n@dataclass\nclass RingDtypes:\n    pass\n",
            "b.py": "from typing import NamedTuple\n\nclass Rings(NamedTuple):\n    g: int\n",
            "c.py": "class Plain:\n    pass\n",
        },
    )
    paths = sorted(tmp_path.glob("*.py"))
    found = record_class_names(paths, 1, lambda path: path.read_bytes())
    assert found == {"RingDtypes", "Rings"}
