"""Reading source files faithfully and writing fixes atomically.

A file is decoded the way Python itself would (BOM, encoding cookie) and written back the same
way: same encoding, same BOM, same line endings (fixes only touch the text they replace), same
permissions. A write goes to a temporary file beside the original and replaces it in one rename,
and only if the original still holds what was read: a file edited in the meantime is left alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path

_ANY_WRITE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


class FileProblem(Exception):
    """A file could not be read or written; the message says why and what was (not) done."""


@dataclass(frozen=True)
class SourceFile:
    path: Path
    raw: bytes
    text: str
    encoding: str
    """The codec the text was decoded with (``utf-8-sig`` when the file starts with a BOM)."""

    def encode(self, text: str) -> bytes:
        return text.encode(self.encoding)


def decode_source(raw: bytes) -> tuple[str, str]:
    """Decode Python source bytes: returns (text, encoding). Raises :class:`FileProblem`."""
    if b"\x00" in raw:
        raise FileProblem("is a binary file, not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as error:
        if error.msg.startswith("invalid or missing encoding declaration"):
            # detect_encoding's wording for "the first two lines are not UTF-8 and no cookie".
            raise _not_text(raw, "utf-8", _first_undecodable(raw)) from None
        raise FileProblem(f"has an invalid encoding declaration: {error.msg}") from None
    try:
        return raw.decode(encoding), encoding
    except UnicodeDecodeError as error:
        raise _not_text(raw, encoding, error.start) from None
    except LookupError:
        raise FileProblem(f"declares an unknown encoding `{encoding}`") from None


def _first_undecodable(raw: bytes) -> int:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return error.start
    return 0


def _not_text(raw: bytes, encoding: str, offset: int) -> FileProblem:
    line = raw.count(b"\n", 0, offset) + 1
    return FileProblem(
        f"is not valid {encoding} text (line {line}, byte {offset}); is it really Python source? "
        "Save it as UTF-8, or declare its encoding with a `# -*- coding: ... -*-` line"
    )


def read_source(path: Path) -> SourceFile:
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise FileProblem("is a directory, not a file")
        # Opening a FIFO or a device would block or never end: only regular files are read.
        if not stat.S_ISREG(mode):
            raise FileProblem("is not a regular file (a named pipe, socket or device); not read")
        raw = path.read_bytes()
    except IsADirectoryError:
        raise FileProblem("is a directory, not a file") from None
    except FileNotFoundError:
        if path.is_symlink():
            raise FileProblem("is a symbolic link to a file that does not exist") from None
        raise FileProblem("does not exist (was it deleted while replaylint ran?)") from None
    except OSError as error:
        raise FileProblem(f"cannot be read: {error.strerror or error}") from None
    text, encoding = decode_source(raw)
    return SourceFile(path, raw, text, encoding)


def write_atomically(source: SourceFile, new_text: str) -> None:
    """Replace the file's content with ``new_text``, all or nothing."""
    target = source.path.resolve()  # write through a symlink, never replace the link itself
    try:
        data = source.encode(new_text)
    except UnicodeEncodeError as error:
        raise FileProblem(
            f"cannot be fixed: the fix needs {error.object[error.start : error.end]!r}, which its "
            f"encoding {source.encoding} cannot represent; left unchanged"
        ) from None
    try:
        status = target.stat()
    except OSError as error:
        raise FileProblem(f"cannot be fixed: {error.strerror or error}; left unchanged") from None
    # os.access alone says "writable" to root; a file with no write bit is read-only for us too.
    if not os.access(target, os.W_OK) or not status.st_mode & _ANY_WRITE:
        raise FileProblem("is read-only; the fix was not written (make it writable to fix it)")
    try:
        handle, temporary = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name}.", suffix=".replaylint.tmp"
        )
    except OSError as error:
        raise FileProblem(
            f"cannot be fixed: no temporary file in its folder ({error.strerror}); left unchanged"
        ) from None
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, stat.S_IMODE(status.st_mode))
        with contextlib.suppress(OSError):
            os.chown(temporary, status.st_uid, status.st_gid)
        if target.read_bytes() != source.raw:
            raise FileProblem("changed on disk while replaylint was fixing it; not overwritten")
        os.replace(temporary, target)
    except FileProblem:
        _remove(temporary)
        raise
    except OSError as error:
        _remove(temporary)
        raise FileProblem(
            f"could not be written ({error.strerror or error}); the original is unchanged"
        ) from None
    except BaseException:
        _remove(temporary)
        raise


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
