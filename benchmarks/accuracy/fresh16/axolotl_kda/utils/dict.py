"""Attribute-style config dicts, and the block-mapping subset of YAML the example configs use."""

from __future__ import annotations

from typing import Any


class DictDefault(dict):
    """A ``dict`` whose keys also read as attributes; a key that is not set reads as ``None``.

    Nested mappings are converted on assignment, so ``cfg.kda.ring_len`` works on a loaded config.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, dict) and not isinstance(value, DictDefault):
            value = DictDefault(value)
        super().__setitem__(key, value)

    def __missing__(self, key: str) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self[name]

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        del self[name]

    def merged(self, other: dict | None = None, **kwargs: Any) -> "DictDefault":
        """A copy with ``other`` (and ``kwargs``) merged in; nested sections merge key by key."""
        result = DictDefault()
        for key, value in self.items():
            result[key] = value.merged() if isinstance(value, DictDefault) else value
        for key, value in dict(other or {}, **kwargs).items():
            if isinstance(value, dict) and isinstance(result[key], DictDefault):
                result[key] = result[key].merged(value)
            else:
                result[key] = value
        return result

    __or__ = merged


def _parse_scalar(text: str) -> Any:
    text = text.strip()
    if text in ("", "~", "null", "None"):
        return None
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _strip_comment(line: str) -> str:
    if line.lstrip().startswith("#"):
        return ""
    position = line.find(" #")
    return (line if position < 0 else line[:position]).rstrip()


def load_yaml(text: str) -> DictDefault:
    """Parses nested ``key: value`` mappings, ``- item`` lists and plain scalars."""
    lines = [_strip_comment(raw) for raw in text.splitlines()]
    lines = [line for line in lines if line.strip()]
    root = DictDefault()
    stack: list[tuple[int, Any]] = [(-1, root)]
    for number, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        content = line.strip()
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if content.startswith("- "):
            parent.append(_parse_scalar(content[2:]))
            continue
        key, _, rest = content.partition(":")
        key = key.strip()
        if rest.strip():
            parent[key] = _parse_scalar(rest)
            continue
        following = lines[number + 1].strip() if number + 1 < len(lines) else ""
        parent[key] = [] if following.startswith("- ") else DictDefault()
        stack.append((indent, parent[key]))
    return root
