"""``replaylint server``: a Language Server for editors (the ``lsp`` extra, on pygls).

It publishes the linter's findings as diagnostics when a Python file is opened, changed or saved
(rule code, message, a link to the rule's page; ``# noqa`` honoured), offers a quick fix for each
fixable finding and a "fix all" source action, reads the configuration of the file's project, and
learns gate-cache names from the project's decode calls as a command-line run does. Set-up for VS
Code and Neovim: docs/editors.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from replaylint.server.project import Project, ProjectIndex

__all__ = ["MissingExtraError", "Project", "ProjectIndex", "serve"]


class MissingExtraError(ImportError):
    """pygls (the ``lsp`` extra) is not installed; the message says how to install it."""


_MISSING = (
    "`replaylint server` needs the language-server extra; "
    "install it with `pip install 'replaylint[lsp]'`."
)


def serve(argv: Sequence[str] = ()) -> int:
    """Run the server over stdin/stdout until the client exits it; returns the exit code."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="replaylint server",
        description="Run the replaylint language server over stdin and stdout.",
        allow_abbrev=False,
    )
    parser.parse_args(list(argv))
    try:
        from replaylint.server.protocol import create_server
    except ImportError as error:
        if error.name in {"pygls", "lsprotocol"} or "pygls" in str(error):
            raise MissingExtraError(_MISSING) from error
        raise
    create_server().start_io()
    return 0
