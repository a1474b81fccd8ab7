"""The records of a JSON or JSON Lines file, one at a time.

A file is parsed as it is read, never held as a whole parsed tree: records that make no document (an empty text, a
repeated record) are priced by no memory plan, and an 8 MB file of 650,000 '{"text": ""}' records held them all at once
(peak RSS +217 MB as JSON Lines, +133 MB as one JSON list; +15 MB one at a time). Only their documents stay. The first
problem in the file is the one named (a record of the wrong shape before a syntax error further on).
"""
from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError

SHAPE = 'a list of objects or {"documents": [...]}'
_WS = re.compile(r"[ \t\n\r]*")  # the white space JSON allows between values (as json.decoder's)
_DECODER = json.JSONDecoder()


def records(path: Path, raw: str) -> Iterator[Any]:
    """JSON: the items of a list or of {"documents": [...]}; JSONL: the object on each non-blank line. An InputError
    naming the file (and the line) when it is not valid JSON or of another shape; it may come after some records."""
    if path.suffix.lower() == ".jsonl":
        yield from _lines(path, raw)
        return
    try:
        start = _skip(raw, 0)
        opening = raw[start : start + 1]
        if opening == "[":
            end = yield from _array(raw, start)
        elif opening == "{":
            end = yield from _documents(path, raw, start)
        else:
            data = json.loads(raw)
            raise InputError(f"{path}: expected {SHAPE}, found {json_type(data)}")
        end = _skip(raw, end)
        if end != len(raw):
            raise json.JSONDecodeError("Extra data", raw, end)
    except InputError:
        raise
    except (ValueError, RecursionError) as exc:  # + too deep, or a number too long to convert
        raise InputError(f"{path} is not valid JSON: {json_error(exc)}") from None


def _lines(path: Path, raw: str) -> Iterator[Any]:
    start, n = 0, 1
    while start <= len(raw):  # JSON Lines: split at "\n" only, U+2028 and U+0085 may sit in a string
        end = raw.find("\n", start)
        end = len(raw) if end < 0 else end
        if raw[start:end].strip():
            try:
                yield json.loads(raw[start:end])
            except (ValueError, RecursionError) as exc:
                raise InputError(f"{path}: line {n} is not valid JSON: {json_error(exc)}") from None
        start, n = end + 1, n + 1


def _array(raw: str, i: int) -> Generator[Any, None, int]:
    """The items of the list at ``raw[i]`` ("["), one at a time; returns the index after its "]"."""
    i = _skip(raw, i + 1)
    if raw[i : i + 1] == "]":
        return i + 1
    while True:
        item, i = _DECODER.raw_decode(raw, i)
        yield item
        i = _skip(raw, i)
        if raw[i : i + 1] == "]":
            return i + 1
        if raw[i : i + 1] != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", raw, i)
        i = _skip(raw, i + 1)


def _documents(path: Path, raw: str, i: int) -> Generator[Any, None, int]:
    """The items of the "documents" list of the object at ``raw[i]`` ("{"), one at a time; its other members are
    parsed and dropped. Returns the index after its "}"."""
    keys: list[str] = []
    i = _skip(raw, i + 1)
    while raw[i : i + 1] != "}" or not keys:
        if keys:  # after a member
            if raw[i : i + 1] != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", raw, i)
            i = _skip(raw, i + 1)
        elif raw[i : i + 1] == "}":  # {}
            break
        if raw[i : i + 1] != '"':
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", raw, i)
        key, i = _DECODER.raw_decode(raw, i)
        i = _skip(raw, i)
        if raw[i : i + 1] != ":":
            raise json.JSONDecodeError("Expecting ':' delimiter", raw, i)
        i = _skip(raw, i + 1)
        if key == "documents" and key in keys:
            raise InputError(f"{path}: the key 'documents' is given twice")
        if key == "documents" and raw[i : i + 1] == "[":
            i = yield from _array(raw, i)
        else:
            value, i = _DECODER.raw_decode(raw, i)
            if key == "documents":
                raise InputError(f"{path}: expected {SHAPE}, found an object whose 'documents' is {json_type(value)}")
        keys.append(key)
        i = _skip(raw, i)
    if "documents" not in keys:
        raise InputError(f"{path}: expected {SHAPE}, found an object with keys {sorted(set(keys))[:5]}")
    return i + 1


def _skip(raw: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is not JSON white space."""
    space = _WS.match(raw, i)
    return space.end() if space else i


def json_error(exc: Exception) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]


def json_type(value: object) -> str:
    return "null" if value is None else f"a JSON {type(value).__name__.replace('dict', 'object').replace('str', 'string')}"
