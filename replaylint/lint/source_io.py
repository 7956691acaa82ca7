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
        raise FileProblem(f"has an invalid encoding declaration: {error.msg}") from None
    try:
        return raw.decode(encoding), encoding
    except UnicodeDecodeError as error:
        raise FileProblem(
            f"is not valid {encoding} text (byte {error.start}); is it really Python source?"
        ) from None
    except LookupError:
        raise FileProblem(f"declares an unknown encoding `{encoding}`") from None


def read_source(path: Path) -> SourceFile:
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise FileProblem("is a directory, not a file") from None
    except FileNotFoundError:
        raise FileProblem("does not exist (was it deleted while replaylint ran?)") from None
    except OSError as error:
        raise FileProblem(f"cannot be read: {error.strerror or error}") from None
    text, encoding = decode_source(raw)
    return SourceFile(path, raw, text, encoding)


def write_atomically(source: SourceFile, new_text: str) -> None:
    """Replace the file's content with ``new_text``, all or nothing."""
    target = source.path.resolve()  # write through a symlink, never replace the link itself
    data = source.encode(new_text)
    try:
        status = target.stat()
    except OSError as error:
        raise FileProblem(f"cannot be fixed: {error.strerror or error}; left unchanged") from None
    if not os.access(target, os.W_OK):
        raise FileProblem("is read-only; the fix was not written")
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
