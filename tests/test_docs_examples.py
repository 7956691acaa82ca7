"""The examples in docs/ work: the library example prints what docs/library.md says, and the
CI workflows of docs/ci.md are valid YAML whose replaylint commands run and write readable
reports."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _blocks(page: Path) -> tuple[str, str]:
    text = page.read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```\n\nprints\n\n```text\n(.*?)```", text, flags=re.S)
    assert match is not None, f"{page}: no python block followed by its output"
    return match.group(1), match.group(2)


def test_library_example_prints_what_the_docs_say(tmp_path: Path) -> None:
    code, expected = _blocks(ROOT / "docs" / "library.md")
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected


BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"


def _workflows() -> list[Any]:
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S)]


def _run_shell_line(line: str, cwd: Path) -> int:
    words = shlex.split(line.split(" || ")[0])
    assert words[0] == "replaylint", line
    done = subprocess.run(
        [sys.executable, "-m", "replaylint", *words[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CI_PROJECT_DIR": str(cwd)},
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode


def test_github_workflow(tmp_path: Path) -> None:
    github, _ = _workflows()
    steps = github["jobs"]["replaylint"]["steps"]
    runs = [step["run"] for step in steps if "run" in step]
    assert runs[0].startswith("pip install ")
    (tmp_path / "pool.py").write_text(BUGGY)
    assert _run_shell_line(runs[1], tmp_path) == 1
    _run_shell_line(runs[2], tmp_path)
    [upload] = [step for step in steps if "upload-sarif" in step.get("uses", "")]
    sarif = json.loads((tmp_path / upload["with"]["sarif_file"]).read_text())
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == ["RL001"]


def test_gitlab_job(tmp_path: Path) -> None:
    _, gitlab = _workflows()
    job = gitlab["replaylint"]
    (tmp_path / "pool.py").write_text(BUGGY)
    codes = [_run_shell_line(line, tmp_path) for line in job["script"][1:]]
    assert codes == [0, 1]
    reports = job["artifacts"]["reports"]
    [issue] = json.loads((tmp_path / reports["codequality"]).read_text())
    assert issue["location"]["path"] == "pool.py"
    suites = ElementTree.parse(tmp_path / reports["junit"]).getroot()
    assert suites.attrib["failures"] == "1"
