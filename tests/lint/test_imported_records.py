"""Records of the rings' dtypes that another module of the project defines: a construction that
gives the gate field a narrower literal is reported where it is written (and fixed there), and a
read of the field through an instance whose class is known trusts a float32 default, since every
construction that sets the field is checked where it is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from project_support import cli_rows, fix_in_project, index_of, lint_in_project, write_tree

from replaylint.lint.engine import Linter
from replaylint.lint.gatecache.names import GateCacheNames
from replaylint.lint.run.name_tables import tables_in
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


_NAMED_TUPLE_CONFIGS = """
from typing import NamedTuple

import torch

DTYPE_MAP = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ReplayRingDType(NamedTuple):
    d: torch.dtype
    k: torch.dtype
    g: torch.dtype
"""

_SERVER_ARGS = """
from dataclasses import dataclass

from .configs import DTYPE_MAP, ReplayRingDType


@dataclass
class ServerArgs:
    replay_ring_dtype: str = "bfloat16"


def ring_dtypes(server_args: ServerArgs) -> ReplayRingDType:
    ring = DTYPE_MAP[server_args.replay_ring_dtype]
    return ReplayRingDType(d=ring, k=ring, g=ring)


def ring_dtypes_fp32_gates(server_args: ServerArgs) -> ReplayRingDType:
    ring = DTYPE_MAP[server_args.replay_ring_dtype]
    return ReplayRingDType(d=ring, k=ring, g=DTYPE_MAP["float32"])
"""


def test_a_file_that_only_builds_an_imported_dtype_record_is_analysed(tmp_path: Path) -> None:
    # `server_args.py` names no gate cache: the record's gate field lets it through the
    # pre-filter; a key of the table not known here may pick any of its entries
    files = {
        "pyproject.toml": "[tool.replaylint]\n",
        "pkg/__init__.py": "",
        "pkg/configs.py": _NAMED_TUPLE_CONFIGS,
        "pkg/server_args.py": _SERVER_ARGS,
    }
    write_tree(tmp_path, files)
    for cache in ((), ("--no-cache",)):
        rows = [row for row in cli_rows(tmp_path, *cache) if row[0] == "pkg/server_args.py"]
        assert rows == [("pkg/server_args.py", 13, "RL001")]
    index = index_of(sorted(tmp_path.rglob("*.py")))
    index.name_tables = frozenset({"ReplayRingDType"})  # what the run's table pass finds
    path = tmp_path / "pkg/server_args.py"
    found = Linter(project=index).check(path.read_text(encoding="utf-8"), str(path))
    assert [f.location.row for f in found] == [13]
    assert "`g` of `ReplayRingDType`, the gate ring's dtype, may be given" in found[0].message


def test_a_record_class_with_a_gate_dtype_field_is_a_name_table() -> None:
    assert tables_in(_NAMED_TUPLE_CONFIGS.encode(), GateCacheNames()) == {"ReplayRingDType"}
    plain = b"class Shape(NamedTuple):\n    g: int\n"
    assert tables_in(plain, GateCacheNames()) == set()


_RING_DTYPES = {
    "pkg/__init__.py": "",
    "pkg/config.py": """
        from typing import NamedTuple

        import torch

        STORAGE = {"32-true": torch.float32, "bf16-true": torch.bfloat16}


        class RingDtypes(NamedTuple):
            delta: torch.dtype
            key: torch.dtype
            gate: torch.dtype = torch.float32


        def ring_dtypes(precision):
            storage = STORAGE[precision]
            if precision.endswith("-true"):
                return RingDtypes(delta=storage, key=storage, gate=storage)
            return RingDtypes(delta=storage, key=storage)
        """,
    "pkg/state.py": """
        import torch

        from pkg.config import RingDtypes


        def allocate(shape, dtypes: RingDtypes):
            return {
                "d_cache": torch.zeros(shape, dtype=dtypes.delta),
                "g_cache": torch.zeros(shape, dtype=dtypes.gate),
            }
        """,
}


def test_a_gate_field_with_a_float32_default_is_judged_at_each_construction(
    tmp_path: Path,
) -> None:
    # the allocation reads the field; the construction that hands it the rings' value is wrong
    assert lint_in_project(tmp_path, _RING_DTYPES, "pkg/state.py") == []
    found = lint_in_project(tmp_path, _RING_DTYPES, "pkg/config.py")
    assert [(f.location.row, f.code) for f in found] == [(17, "RL002")]
    assert "the value given to `delta` for another ring" in found[0].message
