"""JSON / YAML documents from outside (config files, pods files, `--pods`), decoded safely.

One decoder for every document we read: JSON first (fast, and a truncated JSON
file is always an error), then YAML with the safe loader and without aliases
(`*ref` is how a small file becomes a huge document; none of our formats needs
it). Every failure is a `DocumentError` with a one-line message; the caller
prefixes what was being read.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

__all__ = ["DocumentError", "decode"]


class DocumentError(ValueError):
    """Not a usable JSON/YAML document; the message is one line."""


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*ref) are not allowed", event.start_mark)
        return super().compose_node(parent, index)


def _first_line(text: str, limit: int = 200) -> str:
    line = text.splitlines()[0] if text else ""
    return line[:limit]


def decode(data: bytes | str, *, whole_file: bool = False) -> Any:
    """The document in `data` (JSON or YAML). Raises DocumentError.

    whole_file: `data` is a file another program writes; YAML must then end with a newline.
    A YAML file cut while being written is often still valid YAML ("memory: 25" of "256Mi"),
    while every editor and serializer ends the file with a newline. (Cut JSON never parses.)
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DocumentError(f"not UTF-8 text (byte {e.start})") from None
    else:
        text = data
    if not text.strip():
        raise DocumentError("empty")
    if text.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML flow style also starts so; let the YAML parser say where it breaks
        except RecursionError:
            raise DocumentError("nested too deeply") from None
    try:
        doc = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or _first_line(str(e))
        raise DocumentError(f"not valid YAML (or JSON){where}: {problem}") from None
    except RecursionError:
        raise DocumentError("nested too deeply") from None
    except (ValueError, TypeError, AttributeError, OverflowError) as e:
        # PyYAML's constructors raise these for bad dates, !!int text, over-long integers, ...
        raise DocumentError(f"not valid YAML: {_first_line(str(e)) or type(e).__name__}") from None
    if whole_file and not text.endswith("\n"):
        raise DocumentError("YAML that does not end with a newline")
    return doc
