"""``replaylint server`` through a real LSP client (pytest-lsp): initialise over stdio, open a
file with a bfloat16 gate cache, receive its diagnostics, apply the quick fix the server offers,
and receive none. Skipped when the ``lsp`` extra (pygls) or pytest-lsp is not installed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("pygls", reason="the lsp extra (pygls) is not installed")
pytest_lsp = pytest.importorskip("pytest_lsp", reason="pytest-lsp is not installed")

from lsprotocol import types  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
BUGGY = "import torch\ng_cache = torch.zeros(4, 16, dtype=torch.bfloat16)\n"
# A name no pattern matches, taught by a decode call in another file of the project.
POOL = "import torch\n\nclass Pool:\n    def __init__(self):\n        self.decay_ring = torch.zeros(4, 8, dtype=torch.bfloat16)\n"
STEP = "def step(pool):\n    replayssm_decode(q, k, v, s, d, kk, a, b, c, pool.decay_ring)\n"

CONFIG = ClientServerConfig(
    server_command=[sys.executable, "-m", "replaylint", "server"],
    server_env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "pyproject.toml").write_text('[tool.replaylint]\nselect = ["RL001"]\n')
    (folder / "step.py").write_text(STEP)
    return folder


@pytest_lsp.fixture(config=CONFIG)
async def client(lsp_client: LanguageClient, workspace: Path):  # type: ignore[no-untyped-def]
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="ws")],
        )
    )
    yield
    await lsp_client.shutdown_session()


async def _open(client: LanguageClient, path: Path, text: str) -> list[types.Diagnostic]:
    uri = path.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=1, text=text
            )
        )
    )
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return list(client.diagnostics[uri])


def _apply(text: str, edits: list[types.TextEdit]) -> str:
    lines = text.splitlines(keepends=True)

    def offset(position: types.Position) -> int:  # ASCII test text: UTF-16 units are characters
        return sum(len(line) for line in lines[: position.line]) + position.character

    for edit in sorted(edits, key=lambda e: offset(e.range.start), reverse=True):
        start, end = offset(edit.range.start), offset(edit.range.end)
        text = text[:start] + edit.new_text + text[end:]
    return text


@pytest.mark.asyncio
async def test_diagnostics_quick_fix_and_none_after(
    client: LanguageClient, workspace: Path
) -> None:
    path = workspace / "pool.py"
    path.write_text(BUGGY)
    [diagnostic] = await _open(client, path, BUGGY)
    assert diagnostic.code == "RL001"
    assert diagnostic.source == "replaylint"
    assert "torch.bfloat16" in diagnostic.message
    assert diagnostic.code_description is not None
    assert diagnostic.code_description.href.endswith("/docs/rules/RL001.md")
    assert diagnostic.range.start == types.Position(line=1, character=35)
    assert diagnostic.range.end == types.Position(line=1, character=49)

    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=path.as_uri()),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic]),
        )
    )
    assert actions is not None
    kinds = {a.title: a.kind for a in actions if isinstance(a, types.CodeAction)}
    assert kinds == {
        "RL001: Allocate it as torch.float32": types.CodeActionKind.QuickFix,
        "replaylint: fix all safe fixes": "source.fixAll.replaylint",
    }
    [quick] = [a for a in actions if isinstance(a, types.CodeAction) and a.kind == "quickfix"]
    assert quick.edit is not None
    assert quick.edit.changes is not None
    fixed = _apply(BUGGY, list(quick.edit.changes[path.as_uri()]))
    assert fixed == BUGGY.replace("bfloat16", "float32")

    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=path.as_uri(), version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=fixed)],
        )
    )
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    assert list(client.diagnostics[path.as_uri()]) == []


@pytest.mark.asyncio
async def test_noqa_is_honoured(client: LanguageClient, workspace: Path) -> None:
    path = workspace / "quiet.py"
    text = BUGGY.replace("bfloat16)\n", "bfloat16)  # noqa: RL001\n")
    path.write_text(text)
    assert await _open(client, path, text) == []


@pytest.mark.asyncio
async def test_names_learned_from_the_project(client: LanguageClient, workspace: Path) -> None:
    # `decay_ring` is a gate cache only because step.py passes it to the decode entry point.
    path = workspace / "pool.py"
    path.write_text(POOL)
    [diagnostic] = await _open(client, path, POOL)
    assert diagnostic.code == "RL001"
    assert "decay_ring" in diagnostic.message


@pytest.mark.asyncio
async def test_configuration_of_the_files_project(client: LanguageClient, workspace: Path) -> None:
    # The workspace selects RL001 only; a folder with its own configuration ignores it.
    other = workspace / "vendored"
    other.mkdir()
    (other / "replaylint.toml").write_text('ignore = ["RL001"]\n')
    path = other / "pool.py"
    path.write_text(BUGGY)
    assert await _open(client, path, BUGGY) == []


@pytest.mark.asyncio
async def test_excluded_files_and_other_languages_get_no_diagnostics(
    client: LanguageClient, workspace: Path
) -> None:
    (workspace / "pyproject.toml").write_text(
        '[tool.replaylint]\nselect = ["RL001"]\nextend-exclude = ["generated"]\n'
    )
    (workspace / "generated").mkdir()
    excluded = workspace / "generated" / "pool.py"
    excluded.write_text(BUGGY)
    assert await _open(client, excluded, BUGGY) == []
    notes = workspace / "notes.txt"
    notes.write_text(BUGGY)
    uri = notes.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="plaintext", version=1, text=BUGGY
            )
        )
    )
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    assert list(client.diagnostics[uri]) == []


@pytest.mark.asyncio
async def test_fix_all_source_action(client: LanguageClient, workspace: Path) -> None:
    text = BUGGY + "gate_cache = torch.empty(2, dtype=torch.half)\n"
    path = workspace / "two.py"
    path.write_text(text)
    assert len(await _open(client, path, text)) == 2
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=path.as_uri()),
            range=types.Range(
                start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)
            ),
            context=types.CodeActionContext(diagnostics=[], only=["source.fixAll"]),
        )
    )
    assert actions is not None
    [fix_all] = [a for a in actions if isinstance(a, types.CodeAction)]
    assert fix_all.edit is not None
    assert fix_all.edit.changes is not None
    fixed = _apply(text, list(fix_all.edit.changes[path.as_uri()]))
    assert "bfloat16" not in fixed
    assert "torch.half" not in fixed
    assert fixed.count("torch.float32") == 2
