"""Configuration: ``[tool.replaylint]`` in pyproject.toml or a replaylint.toml, found upwards
from the first path or given with ``--config``; every key, and an error naming the key for an
unknown key or a bad value."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from replaylint.lint.config.loading import load_settings
from replaylint.lint.gatecache.entry_points import EntryPoint

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
DECAY_RING = "import torch\ndecay_ring = torch.zeros(4, 16, dtype=torch.bfloat16)\n"


def flagged(cli: RunCli, *args: str) -> list[str]:
    """``file:row`` of every RL001 finding, relative to the working directory."""
    done = cli(*args, "--output-format", "json")
    assert done.returncode in (0, 1), done.stderr
    return [
        f"{Path(f['filename']).relative_to(Path.cwd()).as_posix()}:{f['location']['row']}"
        for f in json.loads(done.stdout)
        if f["code"] == "RL001"
    ]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def pyproject(project: Path, body: str) -> Path:
    return write(project / "pyproject.toml", f"[tool.replaylint]\n{body}")


# finding the configuration -----------------------------------------------------------------------


def test_pyproject_is_found_from_a_subfolder(cli: RunCli, project: Path) -> None:
    pyproject(project, 'ignore = ["RL001"]\n')
    write(project / "src" / "pkg" / "a.py", BUGGY)
    assert flagged(cli, "src/pkg/a.py") == []
    assert flagged(cli, "src") == []


def test_pyproject_without_our_table_is_skipped(cli: RunCli, project: Path) -> None:
    write(project / "replaylint.toml", 'ignore = ["RL001"]\n')
    write(project / "sub" / "pyproject.toml", "[tool.black]\nline-length = 100\n")
    write(project / "sub" / "a.py", BUGGY)
    assert flagged(cli, "sub") == []


def test_replaylint_toml_wins_over_pyproject_in_the_same_folder(cli: RunCli, project: Path) -> None:
    pyproject(project, 'ignore = ["RL001"]\n')
    write(project / "replaylint.toml", "extend-select = []\n")
    write(project / "a.py", BUGGY)
    assert flagged(cli, "a.py") == ["a.py:2"]


def test_nearest_configuration_wins(cli: RunCli, project: Path) -> None:
    pyproject(project, 'ignore = ["RL001"]\n')
    write(project / "sub" / "replaylint.toml", 'select = ["RL"]\n')
    write(project / "sub" / "a.py", BUGGY)
    write(project / "a.py", BUGGY)
    assert flagged(cli, "sub") == ["sub/a.py:2"]
    assert flagged(cli, "a.py") == []


def test_replaylint_toml_may_use_a_tool_table(cli: RunCli, project: Path) -> None:
    write(project / "replaylint.toml", '[tool.replaylint]\nignore = ["RL001"]\n')
    write(project / "a.py", BUGGY)
    assert flagged(cli, "a.py") == []


@pytest.mark.parametrize("name", ["pyproject.toml", "custom.toml"])
def test_config_option(cli: RunCli, project: Path, tmp_path: Path, name: str) -> None:
    body = 'ignore = ["RL001"]\n'
    if name == "pyproject.toml":
        body = "[tool.replaylint]\n" + body
    config = write(tmp_path / "elsewhere" / name, body)
    pyproject(project, 'select = ["RL001"]\n')  # ignored: --config wins over discovery
    write(project / "a.py", BUGGY)
    assert flagged(cli, "a.py") == ["a.py:2"]
    assert flagged(cli, "--config", str(config), "a.py") == []


def test_config_paths_are_relative_to_the_config_file(cli: RunCli, project: Path) -> None:
    pyproject(project, 'extend-exclude = ["src/generated"]\n')
    write(project / "src" / "generated" / "a.py", BUGGY)
    write(project / "src" / "b.py", BUGGY)
    assert flagged(cli) == ["src/b.py:2"]
    assert flagged(cli, "src") == ["src/b.py:2"]


# errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("bogus = 1\n", "unknown key(s) in [tool.replaylint]: bogus; allowed: entry-points"),
        ("line-length = 100\n", "unknown key(s) in [tool.replaylint]: line-length"),
        ('select = "RL001"\n', "`select` must be a list of strings, got 'RL001'"),
        ("select = [1]\n", "`select` must be a list of strings, got [1]"),
        ('select = ["RL9"]\n', "`select`: unknown rule selector `RL9`"),
        ('ignore = ["E501"]\n', "`ignore`: unknown rule selector `E501`"),
        ('extend-select = ["X"]\n', "`extend-select`: unknown rule selector `X`"),
        ('exclude = "build"\n', "`exclude` must be a list of strings, got 'build'"),
        ("extend-exclude = [true]\n", "`extend-exclude` must be a list of strings"),
        ('per-file-ignores = ["tests/*"]\n', "`per-file-ignores` must be a table"),
        ('per-file-ignores = { "t/*" = "RL001" }\n', "`per-file-ignores.t/*` must be a list"),
        ('per-file-ignores = { "t/*" = ["RLX"] }\n', "per-file-ignores: unknown rule selector"),
        ('gate-cache-names = "g"\n', "`gate-cache-names` must be a list of strings"),
        ('gate-cache-names = [""]\n', "`gate-cache-names` entries must be names or globs"),
        ("extend-gate-cache-names = [3]\n", "`extend-gate-cache-names` must be a list of strings"),
        ('extend-gate-cache-names = ["_"]\n', "`extend-gate-cache-names` entries must be names"),
        ('entry-points = "f"\n', "`entry-points` must be a list of tables such as"),
        ('entry-points = ["f"]\n', "each of `entry-points` must be a list of tables"),
        ("entry-points = [{ parameter = 'g' }]\n", "each of `entry-points` must be"),
        ("entry-points = [{ function = '' }]\n", "each of `entry-points` must be"),
        (
            "entry-points = [{ function = 'f', gates = 1 }]\n",
            "unknown key(s) gates in an `entry-points` entry; allowed: function, parameter, index",
        ),
        (
            "entry-points = [{ function = 'f', parameter = 'not a name' }]\n",
            "`parameter` of entry point 'f' must be a parameter name, got 'not a name'",
        ),
        (
            "entry-points = [{ function = 'f', index = -1 }]\n",
            "`index` of entry point 'f' must be a 0-based positional index",
        ),
        ("entry-points = [{ function = 'f', index = true }]\n", "`index` of entry point 'f'"),
        ("entry-points = [{ function = 'f', index = '9' }]\n", "`index` of entry point 'f'"),
        ("select = [\n", "not valid TOML"),
    ],
)
def test_bad_configuration_exits_2_naming_the_problem(
    cli: RunCli, project: Path, body: str, message: str
) -> None:
    config = pyproject(project, body)
    write(project / "a.py", BUGGY)
    done = cli("a.py")
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"replaylint: error: {config}: ")
    assert message in line


def test_bad_replaylint_toml_names_the_file(cli: RunCli, project: Path) -> None:
    config = write(project / "replaylint.toml", "selct = []\n")
    done = cli(".")
    assert done.returncode == 2
    assert done.stderr.startswith(f"replaylint: error: {config}: unknown key(s)")
    assert "selct" in done.stderr


def test_table_that_is_not_a_table(cli: RunCli, project: Path) -> None:
    write(project / "pyproject.toml", 'tool = { replaylint = "yes" }\n')
    done = cli(".")
    assert done.returncode == 2
    assert "[tool.replaylint] must be a table" in done.stderr


def test_missing_config_file(cli: RunCli, project: Path) -> None:
    done = cli("--config", "nope.toml", ".")
    assert done.returncode == 2
    assert done.stderr == "replaylint: error: nope.toml: configuration file not found\n"


# every key ---------------------------------------------------------------------------------------


def test_select_and_cli_override(cli: RunCli, project: Path) -> None:
    pyproject(project, 'select = ["RL00"]\nignore = ["RL001"]\n')
    write(project / "a.py", BUGGY)
    assert flagged(cli, "a.py") == []
    assert flagged(cli, "--select", "RL001", "a.py") == ["a.py:2"]  # more specific than ignore
    assert flagged(cli, "--extend-select", "RL001", "a.py") == ["a.py:2"]


def test_cli_ignore_is_a_layer_over_the_configuration(cli: RunCli, project: Path) -> None:
    pyproject(project, 'select = ["RL001"]\n')
    write(project / "a.py", BUGGY)
    assert flagged(cli, "--ignore", "RL", "a.py") == []
    assert flagged(cli, "--ignore", "RL", "--extend-select", "RL001", "a.py") == ["a.py:2"]
    assert flagged(cli, "--select", "ALL", "--ignore", "RL001", "a.py") == []


def test_extend_select_and_ignore_from_config_and_cli_add_up(cli: RunCli, project: Path) -> None:
    pyproject(project, 'select = []\nextend-select = ["RL001"]\n')
    write(project / "a.py", BUGGY)
    assert flagged(cli, "a.py") == ["a.py:2"]
    assert flagged(cli, "--ignore", "RL001", "a.py") == []


def test_per_file_ignores(cli: RunCli, project: Path) -> None:
    pyproject(
        project,
        'per-file-ignores = { "tests/*" = ["RL001"], "conftest.py" = ["RL"], "*_pb2.py" = ["ALL"] }\n',
    )
    for name in ("tests/test_a.py", "src/a.py", "src/conftest.py", "src/x_pb2.py"):
        write(project / name, BUGGY)
    assert flagged(cli) == ["src/a.py:2"]
    assert flagged(cli, "tests/test_a.py") == []


def test_exclude_replaces_the_defaults_and_extend_exclude_adds(cli: RunCli, project: Path) -> None:
    for name in ("a.py", ".venv/b.py", "third_party/c.py", "gen/d.py"):
        write(project / name, BUGGY)
    assert flagged(cli) == ["a.py:2", "gen/d.py:2", "third_party/c.py:2"]
    pyproject(project, 'exclude = ["third_party"]\n')
    assert flagged(cli) == [".venv/b.py:2", "a.py:2", "gen/d.py:2"]
    pyproject(project, 'extend-exclude = ["third_party", "gen/*.py"]\n')
    assert flagged(cli) == ["a.py:2"]


def test_gate_cache_names(cli: RunCli, project: Path) -> None:
    write(project / "a.py", BUGGY + DECAY_RING.replace("import torch\n", ""))
    assert flagged(cli, "a.py") == ["a.py:2"]
    pyproject(project, 'extend-gate-cache-names = ["decay_ring"]\n')
    assert flagged(cli, "a.py") == ["a.py:2", "a.py:3"]
    pyproject(project, 'gate-cache-names = ["decay_*"]\n')  # replaces the defaults
    assert flagged(cli, "a.py") == ["a.py:3"]
    pyproject(project, 'gate-cache-names = ["decay_ring"]\nextend-gate-cache-names = ["g_cache"]\n')
    assert flagged(cli, "a.py") == ["a.py:2", "a.py:3"]
    # Order in the file does not matter: extend- applies after the replacement.
    pyproject(project, 'extend-gate-cache-names = ["g_cache"]\ngate-cache-names = ["decay_ring"]\n')
    assert flagged(cli, "a.py") == ["a.py:2", "a.py:3"]


def test_entry_points_are_loaded(project: Path) -> None:
    config = pyproject(
        project,
        "entry-points = [\n"
        '  { function = "my_kda_step", parameter = "gates", index = 4 },\n'
        '  { function = "ops.*_decode" },\n'
        "]\n",
    )
    settings = load_settings(("RL001",), config)
    assert settings.entry_points[1:] == (
        EntryPoint("my_kda_step", "gates", 4),
        EntryPoint("ops.*_decode", "g_cache", None),
    )
    assert settings.entry_points[0].function == "*replayssm_decode"  # the default stays


def test_a_valid_full_configuration_runs(cli: RunCli, project: Path) -> None:
    pyproject(
        project,
        'select = ["RL"]\nignore = []\nextend-select = []\nexclude = ["third_party"]\n'
        'extend-exclude = ["tests/fixtures"]\nper-file-ignores = { "tests/*" = ["RL001"] }\n'
        'extend-gate-cache-names = ["decay_ring"]\n'
        'entry-points = [{ function = "my_kda_step", parameter = "gates", index = 4 }]\n',
    )
    write(project / "a.py", BUGGY)
    assert flagged(cli) == ["a.py:2"]
