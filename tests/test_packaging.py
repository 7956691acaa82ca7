"""What a user installs: the metadata in pyproject.toml, the licence, the project URL as one
setting, the minimum-versions pins, and the errors that name the extra to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replaylint._project import PROJECT_URL, docs_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]


def test_project_urls_are_the_one_project_url() -> None:
    urls = PROJECT["urls"]
    assert urls["Homepage"] == PROJECT_URL
    assert all(url.startswith(PROJECT_URL) for url in urls.values()), urls


def test_no_module_spells_the_project_url_itself() -> None:
    host = PROJECT_URL.split("://", 1)[1].split("/", 1)[0]
    spelled = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "replaylint").rglob("*.py")
        if path.name != "_project.py" and host in path.read_text(encoding="utf-8")
    ]
    assert not spelled, f"build links with replaylint._project instead: {spelled}"


def test_links_are_built_from_the_project_url() -> None:
    from replaylint.lint.model import FileReport
    from replaylint.lint.report.sarif import render_sarif
    from replaylint.lint.rules.catalogue import rule_url

    assert rule_url("RL001") == docs_url("docs/rules/RL001.md")
    assert rule_url("RL001").startswith(PROJECT_URL + "/")
    import json

    log = json.loads(render_sarif([FileReport("a.py")]))
    assert log["runs"][0]["tool"]["driver"]["informationUri"] == PROJECT_URL


def test_licence_file_is_the_apache_licence_and_is_shipped() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_extras() -> None:
    extras = PROJECT["optional-dependencies"]
    assert any(req.startswith("packaging") for req in extras["kernels"])  # helion needs it
    assert any(req.startswith("pygls") for req in extras["lsp"])
    assert not any("torch" in req for req in PROJECT["dependencies"])


def _minimum_pins(dependencies: list[str]) -> list[str]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import min_versions
    finally:
        sys.path.pop(0)
    pins: list[str] = min_versions.minimum_pins(dependencies)
    return pins


def test_minimum_pins_of_the_base_dependencies() -> None:
    pins = _minimum_pins(PROJECT["dependencies"])
    floors = {req.split(">=")[0].strip(): req for req in PROJECT["dependencies"]}
    assert set(floors) == {pin.split("==")[0] for pin in pins}
    assert any(pin.startswith("libcst==") for pin in pins)
    assert _minimum_pins(["libcst>=1.8.6,<2", "tomli>=2.0; python_version < '3.11'"]) == [
        "libcst==1.8.6",
        "tomli==2.0; python_version < '3.11'",
    ]
    with pytest.raises(SystemExit, match="one `>=` floor"):
        _minimum_pins(["libcst"])


@pytest.mark.parametrize(
    ("package", "hidden", "extra"),
    [
        ("replaylint.kernels", ["torch"], "kernels"),
        ("replaylint.kernels", ["helion"], "kernels"),
        ("replaylint.guards", ["torch"], "guards"),
    ],
)
def test_optional_parts_name_their_extra(
    tmp_path: Path, package: str, hidden: list[str], extra: str
) -> None:
    # sys.modules[name] = None makes `import name` fail as if it were not installed.
    hide = "".join(f"sys.modules[{name!r}] = None\n" for name in hidden)
    done = subprocess.run(
        [sys.executable, "-c", f"import sys\n{hide}import {package}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ")
    assert f"pip install 'replaylint[{extra}]'" in last  # quoted: works in zsh too
