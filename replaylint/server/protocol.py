"""The language server itself: LSP messages in, the linter's findings out (pygls).

Positions: the linter counts 1-based rows and characters; LSP counts 0-based lines and, unless
the client agreed on another encoding at initialisation, UTF-16 code units. The document's
position codec converts; rows are the linter's own (``\\r\\n``, ``\\r`` or ``\\n`` end a line).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from replaylint._version import __version__
from replaylint.lint.config.loading import ConfigError
from replaylint.lint.model import Applicability, Finding, LineIndex, Location, Mode
from replaylint.lint.report.errors import parse_error
from replaylint.lint.rules.catalogue import RULE_NAMES, rule_url
from replaylint.server.project import ProjectIndex

SOURCE = "replaylint"
FIX_ALL_KIND = f"{types.CodeActionKind.SourceFixAll.value}.replaylint"

log = logging.getLogger(__name__)


class ReplaylintServer(LanguageServer):
    """A pygls server that remembers the projects it has seen."""

    def __init__(self) -> None:
        super().__init__(SOURCE, __version__)
        self.projects = ProjectIndex()


def _position(document: TextDocument, index: LineIndex, location: Location) -> types.Position:
    line = index.line(location.row) if location.row <= len(index.starts) else ""
    prefix = line[: max(location.column - 1, 0)]
    return types.Position(
        line=location.row - 1, character=document.position_codec.client_num_units(prefix)
    )


def _range(document: TextDocument, index: LineIndex, start: Location, end: Location) -> types.Range:
    return types.Range(start=_position(document, index, start), end=_position(document, index, end))


def _path(document: TextDocument) -> Path | None:
    path = document.path or to_fs_path(document.uri)
    return Path(path) if path else None


def _is_python(document: TextDocument, path: Path) -> bool:
    return document.language_id == "python" or path.suffix in {".py", ".pyi"}


def _findings(server: ReplaylintServer, document: TextDocument) -> tuple[list[Finding], Any]:
    """The document's findings and, when it could not be linted, its error (or None)."""
    path = _path(document)
    if path is None or not _is_python(document, path):
        return [], None
    project = server.projects.project_for(path)
    if project.settings.is_excluded(path):  # as the command line's --force-exclude
        return [], None
    report, _ = project.lint(path, document.source)
    return report.findings, parse_error(report)


def _diagnostics(server: ReplaylintServer, document: TextDocument) -> list[types.Diagnostic]:
    index = LineIndex(document.source)
    try:
        findings, error = _findings(server, document)
    except ConfigError as problem:
        server.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Error, message=f"replaylint: {problem}")
        )
        return []
    diagnostics = [
        types.Diagnostic(
            range=_range(document, index, f.location, f.end_location),
            message=f.message,
            severity=types.DiagnosticSeverity.Warning,
            code=f.code,
            code_description=types.CodeDescription(href=rule_url(f.code))
            if f.code in RULE_NAMES
            else None,
            source=SOURCE,
        )
        for f in findings
    ]
    if error is not None:
        at = _position(document, index, error.location)
        diagnostics.append(
            types.Diagnostic(
                range=types.Range(start=at, end=at),
                message=error.message,
                severity=types.DiagnosticSeverity.Error,
                source=SOURCE,
            )
        )
    return diagnostics


def _publish(server: ReplaylintServer, uri: str) -> None:
    document = server.workspace.get_text_document(uri)
    server.text_document_publish_diagnostics(
        types.PublishDiagnosticsParams(
            uri=uri, version=document.version, diagnostics=_diagnostics(server, document)
        )
    )


def _overlaps(a: types.Range, b: types.Range) -> bool:
    def key(p: types.Position) -> tuple[int, int]:
        return (p.line, p.character)

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


def _code_actions(
    server: ReplaylintServer, params: types.CodeActionParams
) -> list[types.CodeAction]:
    document = server.workspace.get_text_document(params.text_document.uri)
    path = _path(document)
    if path is None:
        return []
    wanted = params.context.only
    quick = not wanted or any(k.startswith(types.CodeActionKind.QuickFix) for k in wanted)
    fix_all = not wanted or any(
        FIX_ALL_KIND.startswith(k) or k.startswith(FIX_ALL_KIND) for k in wanted
    )
    findings, _ = _findings(server, document)
    index = LineIndex(document.source)
    actions = []
    for finding in findings:
        fix = finding.fix
        span = _range(document, index, finding.location, finding.end_location)
        if not quick or fix is None or not _overlaps(span, params.range):
            continue
        unsafe = fix.applicability is Applicability.UNSAFE
        edits = [
            types.TextEdit(
                range=_range(document, index, edit.location, edit.end_location),
                new_text=edit.content,
            )
            for edit in fix.edits
        ]
        actions.append(
            types.CodeAction(
                title=f"{finding.code}: {fix.message}" + (" (unsafe)" if unsafe else ""),
                kind=types.CodeActionKind.QuickFix,
                is_preferred=not unsafe,
                edit=types.WorkspaceEdit(changes={document.uri: edits}),
            )
        )
    if fix_all and any(f.fix is not None for f in findings):
        project = server.projects.project_for(path)
        report, fixed = project.lint(path, document.source, Mode.FIX)
        if report.error is None and fixed != document.source:
            whole = types.Range(
                start=types.Position(line=0, character=0),
                end=_position(document, index, index.end()),
            )
            actions.append(
                types.CodeAction(
                    title="replaylint: fix all safe fixes",
                    kind=FIX_ALL_KIND,
                    edit=types.WorkspaceEdit(
                        changes={document.uri: [types.TextEdit(range=whole, new_text=fixed)]}
                    ),
                )
            )
    return actions


def create_server() -> ReplaylintServer:
    server = ReplaylintServer()

    @server.feature(types.INITIALIZED)
    def initialized(ls: ReplaylintServer, params: types.InitializedParams) -> None:
        folders = [
            Path(path)
            for folder in ls.workspace.folders.values()
            if (path := to_fs_path(folder.uri)) is not None
        ]
        ls.projects = ProjectIndex(folders)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: ReplaylintServer, params: types.DidOpenTextDocumentParams) -> None:
        _publish(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: ReplaylintServer, params: types.DidChangeTextDocumentParams) -> None:
        _publish(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: ReplaylintServer, params: types.DidSaveTextDocumentParams) -> None:
        path = to_fs_path(params.text_document.uri)
        if path is not None:
            ls.projects.saved(Path(path))
        _publish(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: ReplaylintServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[])
        )

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(
            code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND],
            resolve_provider=False,
        ),
    )
    def code_action(ls: ReplaylintServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        return _code_actions(ls, params)

    return server
