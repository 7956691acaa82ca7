"""The package layout is the architecture (docs/architecture.md): these tests keep it so.

* Imports between the linter's layers point one way, as the table below (and the doc) says.
* No two packages of the linter import each other, directly or through others.
* A run answered from the result cache never imports libcst (the speed docs promise it).
* Each rule module is named after its rule; the class is named after it too.
* No module grows past the size a reader can hold in mind.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "replaylint"
LINT = "replaylint.lint"

# Each layer of the linter and the layers it may import. A layer is a sub-package of
# replaylint.lint or one of its top-level modules; ``catalogue`` is rules/catalogue.py, which is
# the light index of rules that everything may read without importing a rule.
LAYERS: dict[str, set[str]] = {
    "model": set(),
    "catalogue": set(),
    "syntax": {"model"},
    "project": set(),
    "gatecache": {"model", "syntax"},
    "config": {"model", "gatecache", "catalogue"},
    "dataflow": {"model", "syntax", "gatecache", "project"},
    "fixes": {"model", "syntax", "dataflow"},
    "context": {"model", "syntax", "gatecache", "dataflow", "fixes", "project"},
    "rules": {"model", "syntax", "gatecache", "dataflow", "fixes", "context", "catalogue"},
    "engine": {
        "model",
        "syntax",
        "gatecache",
        "config",
        "dataflow",
        "fixes",
        "context",
        "rules",
        "catalogue",
        "project",
    },
    "run": {"model", "gatecache", "config", "catalogue", "engine", "project"},
    "report": {"model", "catalogue"},
}
# Deliberate exceptions, each with its reason.
ALLOWED_EXTRA: dict[tuple[str, str], str] = {
    ("replaylint.lint.report.sarif", "rules"): "SARIF embeds every rule's full description; "
    "it imports the rules only when that format is asked for",
}
# replaylint.lint/__init__.py re-exports the public API lazily: it may name any layer.
PUBLIC_API = "replaylint.lint"
MAX_MODULE_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield _module_name(path), path


def _imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports (top level, in functions and under TYPE_CHECKING)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield base
            for alias in node.names:  # `from package import module`
                yield f"{base}.{alias.name}"


def _layer(module: str) -> str | None:
    if module == f"{LINT}.rules.catalogue":
        return "catalogue"
    if not module.startswith(f"{LINT}."):
        return None
    return module[len(LINT) + 1 :].split(".")[0]


def _known(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_package_and_module_of_the_linter_has_a_layer() -> None:
    for module, _ in _modules():
        layer = _layer(module)
        if layer is not None:
            assert layer in LAYERS, f"{module}: add its layer {layer!r} to LAYERS and the doc"


def test_imports_follow_the_layer_table() -> None:
    wrong: list[str] = []
    for module, path in _modules():
        layer = _layer(module)
        if layer is None or module == PUBLIC_API:
            continue
        for imported in set(_imports(path)):
            target = _layer(imported)
            if target is None or target == layer or not _known(imported):
                continue
            if target not in LAYERS[layer] and (module, target) not in ALLOWED_EXTRA:
                wrong.append(f"{module} ({layer}) imports {imported} ({target})")
    assert not wrong, "imports against the layer table:\n" + "\n".join(sorted(wrong))


def test_no_cycles_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for module, path in _modules():
        layer = _layer(module)
        if layer is None or module == PUBLIC_API:
            continue
        for imported in _imports(path):
            target = _layer(imported)
            if target is not None and target != layer and _known(imported):
                graph.setdefault(layer, set()).add(target)
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> None:
        if node in done:
            return
        assert node not in visiting, f"package cycle: {' -> '.join([*visiting, node])}"
        visiting.append(node)
        for neighbour in sorted(graph.get(node, ())):
            visit(neighbour)
        visiting.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_the_layer_table_in_the_docs_is_this_one() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]*) \|", doc, flags=re.M))
    documented = {
        layer: {name for name in re.findall(r"`(\w+)`", uses)} for layer, uses in rows.items()
    }
    assert documented == LAYERS


def test_no_module_is_too_long_to_read() -> None:
    long = {
        module: lines
        for module, path in _modules()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these modules (more than {MAX_MODULE_LINES} lines): {long}"


def test_rule_modules_are_named_after_their_rules() -> None:
    from replaylint.lint.rules.catalogue import RULE_MODULES, RULE_NAMES
    from replaylint.lint.rules.registry import ALL_RULES

    assert [rule.CODE for rule in ALL_RULES] == list(RULE_MODULES)
    for rule in ALL_RULES:
        module = rule.__module__.rpartition(".")[2]
        assert module == f"{rule.CODE.lower()}_{rule.NAME.replace('-', '_')}"
        assert RULE_NAMES[rule.CODE] == rule.NAME
        camel = "".join(part.capitalize() for part in rule.NAME.split("-"))
        assert rule.__name__.lower() == camel.lower(), f"{rule.__name__} is not named {camel}"


def test_a_rule_class_cannot_contradict_its_module_name() -> None:
    source = textwrap.dedent(
        """
        from replaylint.lint.rules.base import Rule

        class Misnamed(Rule):
            CODE = "RL002"
        """
    )
    namespace: dict[str, object] = {"__name__": "replaylint.lint.rules.rl001_something"}
    with pytest.raises(TypeError, match="the module name defines it"):
        exec(compile(source, "<rule>", "exec"), namespace)


_WARM_RUN = """
import sys
from replaylint.cli import main
code = main(["check", "--output-format", "json", "--exit-zero", "pool.py"])
print(json.dumps({"libcst": "libcst" in sys.modules, "code": code}), file=sys.stderr)
"""


def _cli_in_process(folder: Path) -> dict[str, object]:
    script = "import json\n" + _WARM_RUN
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    result: dict[str, object] = json.loads(done.stderr.strip().splitlines()[-1])
    result["stdout"] = done.stdout
    return result


def test_a_warm_cached_run_never_imports_libcst(tmp_path: Path) -> None:
    (tmp_path / "pool.py").write_text(
        "import torch\n\ng_cache = torch.zeros(4, 8, dtype=torch.bfloat16)\n", encoding="utf-8"
    )
    cold = _cli_in_process(tmp_path)
    assert cold["libcst"] is True  # the first run analyses the file
    assert '"RL001"' in str(cold["stdout"])
    warm = _cli_in_process(tmp_path)
    assert warm["libcst"] is False, "a run answered from the cache imported libcst"
    assert warm["stdout"] == cold["stdout"]
