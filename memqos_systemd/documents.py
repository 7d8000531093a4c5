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

    def construct_mapping(self, node, deep=False):
        # A key given twice is refused, not "the last one wins": which of the two the writer
        # meant is theirs to say (a config with `memoryReservationPolicy` twice, one commented
        # back in, would otherwise run with whichever comes last).
        seen = set()
        if isinstance(node, yaml.MappingNode):
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    again = key in seen
                except TypeError:  # unhashable: the constructor below says so
                    continue
                if again:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {_short(key)}",
                                                            key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


class _DuplicateKey(Exception):
    """A JSON object with a key twice (not a ValueError: that would send the text to YAML)."""


def _unique_keys(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(key)
    return out


def _short(key: Any) -> str:
    text = repr(key)
    return "".join(ch if ch.isprintable() else "?" for ch in (text if len(text) <= 80 else text[:77] + "..."))


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
            return json.loads(text, object_pairs_hook=_unique_keys)
        except ValueError:
            pass  # YAML flow style also starts so; let the YAML parser say where it breaks
        except RecursionError:
            raise DocumentError("nested too deeply") from None
        except _DuplicateKey as e:
            raise DocumentError(f"not valid JSON: duplicate key {_short(e.args[0])}") from None
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
