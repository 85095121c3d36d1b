"""Untrusted text: one place that decides what may be stored, for every entry point.

Text reaches agentfast from reviewers (forms, API, CLI), from models (content, tool-call
JSON) and from tools (results). Some of it cannot be stored or shown safely:

- a lone surrogate (``"\\ud800"``, which JSON escapes can carry) cannot be encoded as
  UTF-8, so a page, a CSV line or an SSE frame holding it fails to render;
- NUL is refused by PostgreSQL text columns;
- NaN and Infinity are not JSON, and browsers' JSON.parse rejects them;
- JSON nested thousands deep overflows Python's recursion limit on every later read;
- a key written twice in one JSON object keeps only its last value, silently.

People's input is refused with a message naming the field (`require_clean`,
`loads_strict`); what models and tools produce is repaired (`repair`), because refusing
it would lose a run. Either way, what is stored is always valid text.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote_to_bytes

REPLACEMENT = "\ufffd"
MAX_DEPTH = 32  # nesting of JSON values; tool arguments need a handful
REPORT_DEPTH = 200  # a reported result is cut here when Python's JSON reader cannot recurse that deep
# Repairing what is already stored keeps nesting up to here (a model's result may be deep).
MAX_STORED_DEPTH = 200
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")


class DuplicateKey(ValueError):
    """A JSON object naming a key twice: json keeps the last value, which the writer may not have meant."""

    def __init__(self, key: str) -> None:
        shown = key if len(key) <= 80 else key[:79] + "…"
        super().__init__(f"the key {shown!r} appears twice in one object")
        self.key = key


class UnsafeText(ValueError):
    """Input that cannot be stored as it is; the message says what and where."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def problem(value: Any, *, max_depth: int = MAX_DEPTH) -> str | None:
    """Return what is wrong with a string or a JSON-like value, or None if it may be stored."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, where = stack.pop()
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels{_at(where)}"
        if isinstance(item, str):
            bad = _BAD_CHARS.search(item)
            if bad:
                return f"{_describe(bad.group())}{_at(where)}"
        elif isinstance(item, float) and not math.isfinite(item):
            return f"{item!r} is not a JSON number{_at(where)}"
        elif isinstance(item, dict):
            for key, child in item.items():
                key_problem = problem(key, max_depth=0) if isinstance(key, str) else None
                if key_problem:
                    return f"a key {key_problem}{_at(where)}"
                stack.append((child, depth + 1, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1, f"{where}[{index}]") for index, child in enumerate(item))
    return None


def require_plain_name(value: str, *, field: str) -> str:
    """Return a name shown to people unchanged, or raise UnsafeText if it holds a control or invisible format character.

    A zero-width space or a right-to-left override (Unicode categories Cc and Cf) would let
    one name pass for another in the inbox and the run lists.
    """
    require_clean(value, field=field)
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cf"):
            raise UnsafeText(f"{field}: contains U+{ord(char):04X}, a control or invisible character", field=field)
    return value


def require_clean(value: Any, *, field: str) -> Any:
    """Return a person's input unchanged, or raise UnsafeText naming the field and the problem."""
    found = problem(value)
    if found:
        raise UnsafeText(f"{field}: {found}", field=field)
    return value


def repair(value: Any, *, max_depth: int = MAX_DEPTH) -> Any:
    """Return a copy that can always be stored and shown: bad characters become U+FFFD.

    NaN and Infinity become None; containers deeper than `max_depth` become the text
    "(nested too deep)". For model output and tool results, which must never be lost.
    """
    return _repair(value, 0, max_depth)


def _repair(value: Any, depth: int, max_depth: int) -> Any:
    if isinstance(value, str):
        return _BAD_CHARS.sub(REPLACEMENT, value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict | list | tuple) and depth >= max_depth:
        return "(nested too deep)"
    if isinstance(value, dict):
        return {_repair(str(k), depth, max_depth): _repair(v, depth + 1, max_depth) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_repair(item, depth + 1, max_depth) for item in value]
    return value


def undecodable_parameter(query_string: str | bytes) -> str | None:
    """Return the name of a query parameter whose name or value is not UTF-8 once unescaped, or None.

    Django reads such bytes as U+FFFD: `?tool=%FF` would filter by a name no tool has and list
    nothing, unsaid, where a U+FFFD the client sent itself (`%EF%BF%BD`) is text like any other.
    The name is given as it reads, its bad bytes as U+FFFD (it may be the name that is bad).
    """
    raw = query_string if isinstance(query_string, bytes) else query_string.encode("utf-8", "surrogateescape")
    if raw.isascii() and b"%" not in raw:  # every request passes here: ASCII with no escape is text already
        return None
    for part in raw.split(b"&"):  # as Django's QueryDict splits (urllib's parse_qsl)
        name, _, value = (unquote_to_bytes(piece.replace(b"+", b" ")) for piece in part.partition(b"="))
        if not (_is_utf8(name) and _is_utf8(value)):
            return str(repair(name.decode(errors="replace")))
    return None


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


# Python's words when a JSON integer has more digits than it converts (sys.set_int_max_str_digits).
_INT_TOO_LONG = "for integer string conversion"


def is_number_too_long(exc: BaseException) -> bool:
    """Return whether json refused an integer of more digits than Python converts (its words name a setting)."""
    return isinstance(exc, ValueError) and _INT_TOO_LONG in str(exc)


def loads_strict(text: str, *, field: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse a person's JSON; raise UnsafeText for bad JSON, NaN/Infinity, bad characters, deep nesting."""
    if _nesting(text) > max_depth:
        raise UnsafeText(f"{field}: nested deeper than {max_depth} levels", field=field)
    try:
        value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=unique_object)
    except _Constant as exc:
        raise UnsafeText(f"{field}: {exc.args[0]} is not a JSON number", field=field) from None
    except DuplicateKey as exc:
        raise UnsafeText(f"{field}: {exc}", field=field) from None
    except (ValueError, RecursionError) as exc:
        if is_number_too_long(exc):
            raise UnsafeText(f"{field}: a number is too long (over 4,300 digits)", field=field) from None
        raise UnsafeText(f"{field}: not valid JSON ({exc})", field=field) from None
    return require_clean(value, field=field)


def unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Build a JSON object (json's object_pairs_hook, so nested objects too), refusing a key written twice.

    `{"decision": "approved", "decision": "rejected"}` reads as rejected to json, and may read
    as approved to whatever the writer checked it with: a person's JSON says one thing or nothing.
    """
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return value


def loads_lenient(text: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse a model's JSON and repair what cannot be stored; raise ValueError if it is not JSON."""
    if _nesting(text) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    try:
        return repair(json.loads(text), max_depth=max_depth)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth} levels") from None


def loads_report(raw: bytes) -> Any:
    """Parse JSON that must not be refused for what it holds (a result of a call that ran).

    What Python's reader cannot take is kept in a form it can: values nested deeper than
    it recurses are cut to "(nested too deep)", and a whole number over its 4,300 digits
    is kept as its digits' text. Raise ValueError only for text that is not JSON.
    """
    try:
        return json.loads(raw)
    except (RecursionError, ValueError):
        text = raw.decode()  # not UTF-8: the UnicodeDecodeError (a ValueError) says so
        return json.loads(_cut_nesting(text, REPORT_DEPTH), parse_int=_whole_number)


def _whole_number(digits: str) -> int | str:
    try:
        return int(digits)
    except ValueError:  # over sys.get_int_max_str_digits()
        return digits


def _cut_nesting(text: str, max_depth: int) -> str:
    """Return JSON text with each value nested deeper than max_depth replaced by "(nested too deep)"; no recursion."""
    kept: list[str] = []
    kept_to, cut_from = 0, -1
    for index, bracket, depth in _brackets(text):
        if bracket in "[{" and depth == max_depth + 1 and cut_from < 0:
            cut_from = index
        elif bracket in "]}" and depth == max_depth and cut_from >= 0:
            kept += [text[kept_to:cut_from], '"(nested too deep)"']
            kept_to, cut_from = index + 1, -1
    return "".join([*kept, text[kept_to:]])


def dumps(value: Any, **kwargs: Any) -> str:
    """Serialize for display or storage; never fails on what `repair` returns."""
    return json.dumps(repair(value), ensure_ascii=False, allow_nan=False, default=str, **kwargs)


class _Constant(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _Constant(name)


def _nesting(text: str) -> int:
    """Return the deepest bracket nesting of JSON text, ignoring brackets inside strings (cheap, no recursion)."""
    return max((depth for _, bracket, depth in _brackets(text) if bracket in "[{"), default=0)


def _brackets(text: str) -> Iterator[tuple[int, str, int]]:
    """Yield each bracket of JSON text outside its strings: its index, itself, and the depth once it is read."""
    depth = 0
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{]}":
            depth += 1 if char in "[{" else -1
            yield index, char, depth


def _describe(char: str) -> str:
    if char == "\x00":
        return "contains a NUL character"
    return f"contains a lone surrogate (U+{ord(char):04X}), which is not valid text"


def _at(where: str) -> str:
    return f" (at {where})" if where else ""
