"""Reading ``[tool.replaylint]`` from pyproject.toml, or replaylint.toml, into :class:`Settings`.

Every key is checked: an unknown key or a value of the wrong shape is a :class:`ConfigError` that
names the file, the key and what was expected.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from replaylint.lint.config.settings import Settings
from replaylint.lint.gatecache.entry_points import DEFAULT_ENTRY_POINTS, EntryPoint
from replaylint.lint.rules.catalogue import RULE_NAMES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

CONFIG_FILENAMES = ("replaylint.toml", "pyproject.toml")


class ConfigError(Exception):
    """The configuration is invalid; the message says where and how to fix it."""


def find_config(start: Path) -> Path | None:
    """The nearest ``replaylint.toml``, or ``pyproject.toml`` with ``[tool.replaylint]``."""
    directory = start if start.is_dir() else start.parent
    for folder in (directory.absolute(), *directory.absolute().parents):
        candidate = folder / "replaylint.toml"
        if candidate.is_file():
            return candidate
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and "replaylint" in _read_toml(candidate).get("tool", {}):
            return candidate
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the configuration: {error.strerror}") from None


def _string_list(path: Path, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{path}: `{key}` must be a list of strings, got {value!r}")
    return tuple(value)


def _name_patterns(path: Path, key: str, value: object) -> tuple[str, ...]:
    patterns = _string_list(path, key, value)
    if any(not pattern.strip("_ ") for pattern in patterns):
        raise ConfigError(
            f"{path}: `{key}` entries must be names or globs such as "
            f'"decay_ring" or "*_decays", got {value!r}'
        )
    return patterns


def validate_selectors(
    selectors: Iterable[str], known_codes: Iterable[str], where: str
) -> tuple[str, ...]:
    """Upper-case the selectors and check that each names at least one rule."""
    codes = tuple(known_codes)
    result = []
    for selector in selectors:
        normalised = selector.strip().upper()
        if normalised != "ALL" and not any(code.startswith(normalised) for code in codes):
            raise ConfigError(
                f"{where}: unknown rule selector `{selector}`; use a rule code such as "
                f"{codes[0]}, a prefix such as RL00, or ALL (known rules: {', '.join(codes)})"
            )
        result.append(normalised)
    return tuple(result)


def _entry_points(path: Path, value: object) -> tuple[EntryPoint, ...]:
    expected = (
        "a list of tables such as "
        '{ function = "my_replayssm_step", parameter = "g_cache", index = 9 }'
    )
    if not isinstance(value, list):
        raise ConfigError(f"{path}: `entry-points` must be {expected}, got {value!r}")
    entry_points = []
    for item in value:
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, str) or not function.strip():
            raise ConfigError(f"{path}: each of `entry-points` must be {expected}, got {item!r}")
        unknown = set(item) - {"function", "parameter", "index"}
        if unknown:
            raise ConfigError(
                f"{path}: unknown key(s) {', '.join(sorted(unknown))} in an `entry-points` entry; "
                "allowed: function, parameter, index"
            )
        parameter = item.get("parameter", "g_cache")
        index = item.get("index")
        if not isinstance(parameter, str) or not parameter.isidentifier():
            raise ConfigError(
                f"{path}: `parameter` of entry point {item['function']!r} must be "
                f"a parameter name, got {parameter!r}"
            )
        if index is not None and (
            not isinstance(index, int) or isinstance(index, bool) or index < 0
        ):
            raise ConfigError(
                f"{path}: `index` of entry point {item['function']!r} must be a "
                f"0-based positional index (an integer >= 0), got {index!r}"
            )
        entry_points.append(EntryPoint(item["function"], parameter, index))
    return tuple(entry_points)


def _per_file_ignores(
    path: Path, value: object, known: tuple[str, ...]
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(value, dict):
        raise ConfigError(
            f'{path}: `per-file-ignores` must be a table such as {{ "tests/*" = ["RL003"] }}, '
            f"got {value!r}"
        )
    return tuple(
        (
            pattern,
            validate_selectors(
                _string_list(path, f"per-file-ignores.{pattern}", codes),
                known,
                f"{path}: per-file-ignores",
            ),
        )
        for pattern, codes in value.items()
    )


def settings_from_table(path: Path, table: dict[str, Any], known_codes: Iterable[str]) -> Settings:
    known = tuple(known_codes)
    settings = Settings(root=path.parent.absolute(), config_path=path)
    where = f"{path}"

    def selectors(key: str) -> tuple[str, ...]:
        return validate_selectors(_string_list(path, key, table[key]), known, f"{where}: `{key}`")

    handlers: dict[str, Callable[[], Settings]] = {
        "select": lambda: replace(settings, select=selectors("select")),
        "extend-select": lambda: replace(settings, extend_select=selectors("extend-select")),
        "ignore": lambda: replace(settings, ignore=selectors("ignore")),
        "exclude": lambda: replace(
            settings, exclude=_string_list(path, "exclude", table["exclude"])
        ),
        "extend-exclude": lambda: replace(
            settings, extend_exclude=_string_list(path, "extend-exclude", table["extend-exclude"])
        ),
        "per-file-ignores": lambda: replace(
            settings, per_file_ignores=_per_file_ignores(path, table["per-file-ignores"], known)
        ),
        "gate-cache-names": lambda: replace(
            settings,
            gate_cache_patterns=_name_patterns(path, "gate-cache-names", table["gate-cache-names"]),
        ),
        "extend-gate-cache-names": lambda: replace(
            settings,
            gate_cache_patterns=settings.gate_cache_patterns
            + _name_patterns(path, "extend-gate-cache-names", table["extend-gate-cache-names"]),
        ),
        "entry-points": lambda: replace(
            settings, entry_points=DEFAULT_ENTRY_POINTS + _entry_points(path, table["entry-points"])
        ),
    }
    unknown = sorted(set(table) - set(handlers))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) in [tool.replaylint]: {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(handlers))}"
        )
    # gate-cache-names before extend-gate-cache-names, whatever the order in the file.
    for key in sorted(table, key=lambda k: (k.startswith("extend-"), k)):
        settings = handlers[key]()
    return settings


def load_settings(
    known_codes: Iterable[str] | None = None,
    config: Path | None = None,
    start: Path | None = None,
) -> Settings:
    """Settings from ``config`` if given, else from the nearest config file above ``start``
    (default: the working directory). ``known_codes`` are the rule codes selectors may name
    (default: every rule's)."""
    if known_codes is None:
        known_codes = RULE_NAMES
    path = config if config is not None else find_config(start or Path.cwd())
    if path is None:
        return Settings(root=Path.cwd().absolute())
    if not path.is_file():
        raise ConfigError(f"{path}: configuration file not found")
    data = _read_toml(path)
    if path.name == "pyproject.toml":
        table = data.get("tool", {}).get("replaylint", {})
    else:
        table = data.get("tool", {}).get("replaylint", data)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.replaylint] must be a table")
    return settings_from_table(path, table, known_codes)
