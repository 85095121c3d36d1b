"""What every command group shares: the one-line error, JSON parsing of options, and printing."""

from __future__ import annotations

import argparse
import getpass
import math
import re
import socket
import sys
from collections.abc import Callable
from typing import Any

from agents import text

EXIT_REFUSED = 1
EXIT_USAGE = 2
MAX_NAME = 150  # the columns that record a person's name (decided_by, the audit's actor, created_by)
MAX_LIMIT = 1_000_000_000  # well inside the integers every database takes as a LIMIT

Handler = Callable[[argparse.Namespace], "int | None"]

# Stored text (a prompt, a note, a tool's output, a user name) is anyone's: its terminal
# controls would reach the reader's terminal as commands (ESC ] sets the window title, ESC [
# recolours and erases lines, a bare CR overwrites the line, C1 codes U+0080-U+009F act as
# ESC sequences on terminals that read them). Newline and tab keep their meaning. Bidirectional
# overrides and isolates (U+202A-U+202E, U+2066-U+2069, and the marks) reorder how the rest of a
# line reads, so a note could show an id or an amount other than the one stored.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_BIDI}]")
# JSON already escapes C0 controls, but not DEL, C1 nor the bidirectional ones; \u escapes keep the value exact.
_JSON_UNESCAPED_CONTROLS = re.compile(f"[\\x7f-\\x9f{_BIDI}]")


class CliError(Exception):
    """A problem to report in one line, exiting non-zero."""


def command(parent: Any, name: str, handler: Handler, help: str, *, json_flag: bool = False) -> argparse.ArgumentParser:
    """Add a subcommand whose arguments are checked as text before `handler` runs."""
    parser = parent.add_parser(name, help=help, description=help)
    parser.set_defaults(handler=handler, command_parser=parser)
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print JSON")
    return parser


def json_object(value: str | None, flag: str) -> dict[str, Any] | None:
    """Parse a person's JSON object option; refuse NaN, bad characters and deep nesting."""
    if value is None:
        return None
    try:
        parsed = text.loads_strict(value, field=flag)
    except text.UnsafeText as exc:
        raise CliError(exc.message) from None
    if not isinstance(parsed, dict):
        raise CliError(f"{flag} must be a JSON object, like '{{\"amount_cents\": 1000}}'")
    return parsed


def person(name: str, flag: str = "--by") -> str:
    """Return a person's name given as `flag`, without blanks around it; refuse one blank, odd or too long.

    Past the columns that record it, PostgreSQL refused the write ("database error") or the
    name was cut, so the audit named someone other than the one given; SQLite stored it whole.
    """
    name = name.strip()
    if not name:
        raise CliError(f"{flag}: give a name; nothing changed")  # a blank name would be recorded as who decided
    if len(name) > MAX_NAME:
        raise CliError(f"{flag}: at most {MAX_NAME} characters; nothing changed")
    try:
        return text.require_plain_name(name, field=flag)
    except text.UnsafeText as exc:
        raise CliError(f"{exc.message}; nothing changed") from None


def attempt(by: str) -> Any:
    """Return a decision attempt from this command line: the named person, from user@host."""
    from agents import selectors, services

    # Names are unique ignoring case: "Alice" is alice, as `runs start --by` records her (one person, one vote).
    name = selectors.username_as_spelled(person(by))
    return services.Attempt(actor=name, source="cli", origin=f"{getpass.getuser()}@{socket.gethostname()}")


def count(value: str) -> int:
    """Read an option that counts rows (argparse's type): a whole number of at least 1."""
    try:
        number = int(value)
    except ValueError:  # not a number, or more digits than Python reads
        number = 0
    if not 1 <= number <= MAX_LIMIT:
        # A negative limit crashed the slice of a query; 0 printed "No approvals." over a full list.
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1 (and at most {MAX_LIMIT:,})")
    return number


def seconds(value: str) -> float:
    """Read an option that is a time to wait (argparse's type): a number of seconds, 0 or more."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not number >= 0:  # NaN compares false: a deadline of NaN never passed, and the wait never ended
        raise argparse.ArgumentTypeError("must be a number of seconds, 0 or more")
    return number


def echo(line: str = "", *, err: bool = False) -> None:
    """Print a line of stored text: repaired where it cannot be encoded, its terminal controls made visible."""
    print(visible(text.repair(line)), file=sys.stderr if err else sys.stdout)


def visible(line: str) -> str:
    """Return the line with terminal controls as escapes (ESC as `\\x1b`): the reader sees that one was there.

    An escape rather than U+FFFD: it says which control it was, and a shown `\\x1b[31m`
    is plainly an attempt, not a character that failed to decode.
    """
    return _CONTROLS.sub(_escape, line)


def _escape(control: re.Match[str]) -> str:
    code = ord(control.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def print_json(value: Any) -> None:
    """Print a value as JSON that the reader's terminal only displays (no control arrives raw)."""
    shown = _JSON_UNESCAPED_CONTROLS.sub(lambda control: f"\\u{ord(control.group()):04x}", text.dumps(value, indent=2))
    print(shown, file=sys.stdout)


def print_table(headers: list[str], rows: list[list[Any]], indent: str = "") -> None:
    # Escaped before measuring, so a cell holding controls still lines up with its column.
    cells = [headers, *[[visible(str(c)) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        echo(indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def compact(value: Any, limit: int) -> str:
    return cut(text.dumps(value, separators=(",", ":")) if value is not None else "", limit)


def cut(value: str, limit: int) -> str:
    value = " ".join(value.split())
    return value if len(value) <= limit else value[: limit - 1] + "…"


def indent(value: str) -> str:
    return "\n".join("  " + line for line in value.splitlines())


def ago(iso: str | None) -> str:
    from django.utils import timezone
    from django.utils.dateparse import parse_datetime

    when = parse_datetime(iso) if iso else None
    if when is None:
        return ""
    seconds = int((timezone.now() - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{max(seconds, 0)}s ago"
