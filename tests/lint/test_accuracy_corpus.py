"""The accuracy benchmark's scorer, and the corpus it scores (benchmarks/lint_accuracy.py).

The scorer is checked on tiny synthetic inputs: labels are read as documented, a finding on a
labelled statement is true and one elsewhere is false, a correct builder whose output changed is
counted as changed. The corpus is checked so that it cannot rot: every module imports, every
builder runs and is in the registry, the registry's buggy/correct flags match what the builders
return, the labels parse, and the two halves keep the same mix. No accuracy figure is asserted:
those are measurements (docs/lint_accuracy.md).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from benchmark_support import load_benchmark

acc = load_benchmark("lint_accuracy.py")

# The builders run torch (and numpy) code; the minimum-versions run of tests/lint has neither.
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("numpy") is None,
    reason="the corpus builders need torch and numpy",
)

LABELLED = textwrap.dedent(
    """\
    import torch

    NOTE = "a string with # expect-bug: cast is no label"
    ring_dtype = torch.bfloat16  # expect-bug: imported-policy id=policy
    d = torch.zeros(4, dtype=ring_dtype)
    g_cache = torch.zeros(
        4,
        dtype=ring_dtype,  # expect-bug: imported-policy id=policy
    )
    g_ring = g_cache.half()  # expect-bug: cast
    if True:  # expect-bug: like; load id=restore
        pass
    """
)


def _labels() -> list[Any]:
    labels: list[Any] = acc.parse_labels("pkg/mod.py", LABELLED)
    return labels


def test_labels_are_read_with_their_statement_lines_ids_and_categories() -> None:
    labels = _labels()
    got = [(label.line, label.first, label.last, label.category, label.bug) for label in labels]
    assert got == [
        (4, 4, 4, "imported-policy", "pkg:policy"),
        (8, 6, 9, "imported-policy", "pkg:policy"),  # the whole multi-line statement
        (10, 10, 10, "cast", "pkg/mod.py:10"),
        (11, 11, 11, "like", "pkg/mod.py:11"),  # a compound statement: its header only
        (11, 11, 11, "load", "pkg:restore"),
    ]


@pytest.mark.parametrize(
    "comment",
    ["# expect-bug", "# expect-bug: nonsense", "# expect-bug: cast id=", "# expect-bug cast"],
)
def test_a_label_that_cannot_be_read_is_an_error(comment: str) -> None:
    with pytest.raises(ValueError, match="cannot read the label"):
        acc.parse_labels("pkg/mod.py", f"x = 1  {comment}\n")


def test_stripping_labels_keeps_every_line_and_every_other_comment() -> None:
    text = "a = 1  # expect-bug: cast\nb = 2  # noqa: RL001\r\nc = '# expect-bug: cast'\n"
    stripped = acc.strip_labels(text)
    assert stripped == "a = 1\nb = 2  # noqa: RL001\r\nc = '# expect-bug: cast'\n"


def test_a_finding_on_a_labelled_statement_is_true_and_elsewhere_false() -> None:
    labels = _labels()
    findings = [
        acc.Finding("pkg/mod.py", 7, "RL002", "m"),  # inside the labelled multi-line statement
        acc.Finding("pkg/mod.py", 5, "RL002", "m"),  # d: no label
        acc.Finding("other/mod.py", 10, "RL004", "m"),  # same line, other file
    ]
    result = acc.HalfResult("dev")
    lines = {"pkg/mod.py": LABELLED.splitlines(), "other/mod.py": LABELLED.splitlines()}
    acc.score(result, labels, findings, {"pkg": "vllm", "other": "fla"}, lines)
    assert (result.total.findings, result.total.true_findings) == (3, 1)
    # Four bugs (policy, line 10, line 11, restore); only the policy bug was found.
    assert (result.total.bugs, result.total.found) == (4, 1)
    assert result.by_category["imported-policy"].found == 1
    assert result.by_category["cast"].found == 0
    assert result.by_style["fla"].findings == 1
    assert result.by_style["fla"].true_findings == 0
    assert [entry.split(":")[1] for entry in result.false_findings] == ["5", "10"]
    assert len(result.missed) == 3


def _summary(dtype: str, digest: str = "0") -> dict[str, Any]:
    return {"dtype": dtype, "shape": [2], "digest": digest}


def _run(**tensors: dict[str, Any]) -> dict[str, Any]:
    return {"tensors": tensors, "aliases": [], "error": None}


def test_a_correct_builder_whose_output_changed_is_counted_as_changed() -> None:
    before = _run(g_cache=_summary("torch.float32"), d_cache=_summary("torch.bfloat16", "a"))
    after = _run(g_cache=_summary("torch.float32"), d_cache=_summary("torch.bfloat16", "b"))
    outcome, errors = acc.compare_builder("m:build_x", False, ["g_cache"], before, before, after)
    assert errors == []
    assert outcome["outcome"] == "changed"
    assert outcome["changed"] == ["d_cache"]
    same, _ = acc.compare_builder("m:build_x", False, ["g_cache"], before, before, before)
    assert same["outcome"] == "unchanged"


def test_a_buggy_builder_is_fixed_only_when_every_gate_cache_is_float32() -> None:
    before = _run(
        **{"a.g_cache": _summary("torch.bfloat16"), "b.g_cache": _summary("torch.bfloat16")}
    )
    half = _run(**{"a.g_cache": _summary("torch.float32"), "b.g_cache": _summary("torch.bfloat16")})
    full = _run(**{"a.g_cache": _summary("torch.float32"), "b.g_cache": _summary("torch.float32")})
    failed = {"tensors": {}, "aliases": [], "error": "TypeError: boom"}
    outcomes = [
        acc.compare_builder("m:build_x", True, ["g_cache"], before, before, after)[0]["outcome"]
        for after in (half, full, failed)
    ]
    assert outcomes == ["not fixed", "fixed", "error after the fix"]


def test_a_fix_that_also_changes_another_tensors_dtype_is_reported() -> None:
    before = _run(g_cache=_summary("torch.bfloat16"), d_cache=_summary("torch.bfloat16"))
    after = _run(g_cache=_summary("torch.float32"), d_cache=_summary("torch.float32"))
    outcome, _ = acc.compare_builder("m:build_x", True, ["g_cache"], before, before, after)
    assert outcome["outcome"] == "fixed"
    assert outcome["other_dtypes_changed"] == ["d_cache"]


def test_a_registry_flag_that_contradicts_the_builder_is_a_corpus_error() -> None:
    before = _run(g_cache=_summary("torch.float32"))
    _, errors = acc.compare_builder("m:build_x", True, ["g_cache"], before, before, before)
    assert errors == ["m:build_x: registry says buggy=True, observed buggy=False"]
    other = _run(g_cache=_summary("torch.float32", "different"))
    _, errors = acc.compare_builder("m:build_x", False, ["g_cache"], before, other, before)
    assert errors == ["m:build_x: two runs before the fix differ (not deterministic)"]


@needs_torch
def test_builders_run_and_their_outputs_are_flattened(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "mod.py").write_text(
        textwrap.dedent(
            """
            import torch

            def build_rings():
                d_cache = torch.zeros(2, dtype=torch.bfloat16)
                return {"layers": [{"g_cache": torch.zeros(2), "d_cache": d_cache, "view": d_cache[:1]}]}

            def build_broken():
                raise RuntimeError("no")
            """
        ),
        encoding="utf-8",
    )
    results = acc.run_builders(tmp_path, ["pkg.mod:build_rings", "pkg.mod:build_broken", "pkg"])
    rings = results["pkg.mod:build_rings"]
    assert rings["tensors"]["layers.0.g_cache"]["dtype"] == "torch.float32"
    assert rings["aliases"] == [["layers.0.d_cache", "layers.0.view"]]
    assert results["pkg.mod:build_broken"]["error"].startswith("RuntimeError: no")
    assert results["pkg"]["error"] is None


# --- the corpus itself -------------------------------------------------------------------


def _registry(half: str) -> dict[str, Any]:
    registry: dict[str, Any] = json.loads(
        (acc.CORPUS / half / "registry.json").read_text(encoding="utf-8")
    )
    return registry


def _half_labels(half: str) -> list[Any]:
    root = acc.CORPUS / half
    labels: list[Any] = []
    for path in acc.corpus_files(root):
        labels += acc.parse_labels(path.relative_to(root).as_posix(), path.read_text("utf-8"))
    return labels


@needs_torch
@pytest.mark.parametrize("half", acc.HALVES)
def test_every_corpus_module_imports_and_every_builder_runs_as_registered(half: str) -> None:
    root = acc.CORPUS / half
    registry = _registry(half)
    defined = acc.builder_names(root)
    assert sorted(defined) == sorted(registry["builders"]), "registry.json and the build_* differ"
    results = acc.run_builders(root, acc.module_names(root) + defined)
    failed = {name: result["error"] for name, result in results.items() if result["error"]}
    assert not failed
    errors: list[str] = []
    for name in defined:
        buggy, patterns = acc.registered(registry, name)
        result = results[name]
        errors += acc.compare_builder(name, buggy, patterns, result, result, result)[1]
    assert not errors


@pytest.mark.parametrize("half", acc.HALVES)
def test_corpus_labels_parse_and_each_bug_has_one_category(half: str) -> None:
    labels = _half_labels(half)
    assert labels
    categories: dict[str, set[str]] = collections.defaultdict(set)
    for label in labels:
        categories[label.bug].add(label.category)
    assert all(len(names) == 1 for names in categories.values()), categories


def test_the_halves_have_the_same_mix_and_the_fresh_parts_the_same_categories() -> None:
    def mix(half: str) -> collections.Counter[tuple[str, str]]:
        styles = {name: pkg["style"] for name, pkg in _registry(half)["packages"].items()}
        bugs = {label.bug: label for label in _half_labels(half)}
        return collections.Counter(
            (styles[label.path.split("/", 1)[0]], label.category) for label in bugs.values()
        )

    assert mix("dev") == mix("heldout")
    categories = collections.Counter(category for _, category in mix("dev").elements())
    for part in ("fresh", "fresh2"):
        assert categories == collections.Counter(category for _, category in mix(part).elements())


def test_the_linted_copy_carries_no_label(tmp_path: Path) -> None:
    acc.copy_without_labels(acc.CORPUS / "dev", tmp_path)
    for path in acc.corpus_files(acc.CORPUS / "dev"):
        copied = tmp_path / path.relative_to(acc.CORPUS / "dev")
        original, text = path.read_text("utf-8"), copied.read_text("utf-8")
        assert "expect-bug" not in text
        assert len(text.splitlines()) == len(original.splitlines())


def test_each_package_is_linted_as_its_own_project(tmp_path: Path) -> None:
    for name, call in (("taught", "g_ring"), ("untaught", "other")):
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text("", encoding="utf-8")
        (package / "pool.py").write_text(
            "import torch\n\n"
            "g_ring = torch.zeros(4, dtype=torch.bfloat16)\n"
            f"fused_recurrent_kda_replayssm_decode(*range(9), g_cache={call})\n",
            encoding="utf-8",
        )
    findings, errors = acc.lint(tmp_path, ["taught", "untaught"])
    assert errors == []
    # The name learned from the decode call in one package does not carry over to the other.
    assert {f.path for f in findings} == {"taught/pool.py"}
    assert ("taught/pool.py", 3, "RL001") in [(f.path, f.row, f.code) for f in findings]


def test_reports_of_files_that_could_not_be_linted_are_errors(tmp_path: Path) -> None:
    report = json.dumps(
        [
            {"code": None, "message": "could not parse", "filename": str(tmp_path / "a" / "x.py")},
            {
                "code": "RL003",
                "message": "m",
                "filename": str(tmp_path / "a" / "y.py"),
                "location": {"row": 7, "column": 1},
            },
        ]
    )
    findings, errors = acc.read_findings(report, tmp_path)
    assert findings == [acc.Finding("a/y.py", 7, "RL003", "m")]
    assert errors == ["a/x.py: could not parse"]
