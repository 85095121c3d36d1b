"""Template filters of the dashboard: short relative times, pretty, escaped JSON, and quick forms of built-ins.

The inbox renders twenty cards a page, the runs page twenty-five rows and the audit fifty: `iso_time`,
`datetime_text` and `truncate` give what `date:'c'`, `date:"Y-m-d H:i"` and `truncatechars` give,
without their general machinery (a DateFormat object per date, a character walk per prompt), which
took a tenth of the page.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from datetime import datetime
from typing import Any

from cachetools import LRUCache
from django import template
from django.template.defaultfilters import stringfilter
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from agents import text
from agents.gateway.selectors import external_request as _external_request

register = template.Library()

# Bidirectional overrides, embeddings, isolates and marks reorder how the rest of a line reads, so
# an agent's argument could show a reviewer an account or an amount other than the one stored; C1
# controls show as nothing. In JSON they stand only inside strings, and a \u escape there means the
# same character: the value stays exact, and the reviewer sees it (as `agentfast approvals show` does).
_HIDDEN = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape_hidden(value: str) -> str:
    return _HIDDEN.sub(lambda control: f"\\u{ord(control.group()):04x}", value)


def shown_json(value: Any, **kwargs: Any) -> str:
    """Return JSON for a reviewer to read (or edit): text.dumps, with the characters that hide or reorder text escaped."""
    return _escape_hidden(text.dumps(value, **kwargs))


def shown_text(value: str) -> str:
    """Return text made from an agent's arguments (a call's summary) with its hiding and reordering characters escaped."""
    return _escape_hidden(value)


def _elapsed(value: datetime) -> str:
    seconds = max(0, int((timezone.now() - value).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


@register.filter
def elapsed(value: datetime | None) -> str:
    """Render the time since a moment as '2 s', '3 min', '5 h' (static/js/app.js keeps it fresh)."""
    return _elapsed(value) if value else ""


@register.filter(expects_localtime=True)
def iso_time(value: datetime | None) -> str:
    """Return a moment as `date:'c'` does (ISO 8601 in the current time zone), or "" for none."""
    return value.isoformat() if value else ""


@register.filter(expects_localtime=True)
def datetime_text(value: datetime | None, precision: str = "minutes") -> str:
    """Return a moment as `date:"Y-m-d H:i"` does ("seconds": `date:"Y-m-d H:i:s"`), or "" for none."""
    if not value:
        return ""
    text = f"{value.year:04d}-{value.month:02d}-{value.day:02d} {value.hour:02d}:{value.minute:02d}"
    return f"{text}:{value.second:02d}" if precision == "seconds" else text


@register.filter
def from_iso(value: str | None) -> datetime | None:
    """Return the moment an event's ISO 8601 text names (events are JSON), or None for none or bad text."""
    try:
        return datetime.fromisoformat(value) if value else None
    except (TypeError, ValueError):
        return None


@register.filter(is_safe=True)
@stringfilter
def truncate(value: str, length: int) -> str:
    """Return text as `truncatechars` does: NFC, cut to `length` characters with an ellipsis when longer."""
    normalized = unicodedata.normalize("NFC", value)
    if len(normalized) <= length:  # combining characters do not count, so it fits
        return normalized
    return Truncator(value).chars(length)


@register.filter
def pretty_json(value: Any) -> str:
    """Return indented JSON as plain text; autoescape makes any markup in it harmless.

    Repaired first (agents.text): rows written by older versions may hold lone surrogates,
    and a page must render whatever is stored.
    """
    return shown_json(value, indent=2)


@register.filter
def shown(value: Any) -> str:
    """Return model- or agent-written text with its hiding and reordering characters escaped (as shown_text)."""
    return shown_text(text.repair(str(value)))


@register.filter
def compact_json(value: Any) -> str:
    """Return one-line JSON as plain text, for tables."""
    return shown_json(value)


@register.filter
def startswith(value: str, prefix: str) -> bool:
    return str(value).startswith(prefix)


@register.filter
def json_text(value: str) -> str:
    """Pretty-print a JSON string (a tool output, wire-format arguments); other text as is."""
    try:
        return pretty_json(text.loads_lenient(value))
    except (TypeError, ValueError):
        return text.repair(value)


@register.filter
def arguments_changes(approval: Any) -> list[dict[str, str]]:
    """Return what a reviewer's edit changed, key by key: {key, old, new} as compact JSON."""
    before = approval.tool_call.arguments or {}
    after = approval.arguments if approval.arguments is not None else before
    if not isinstance(before, dict) or not isinstance(after, dict):
        return [{"key": "arguments", "old": shown_json(before), "new": shown_json(after)}]
    missing = object()
    changes = []
    for key in [*before, *(key for key in after if key not in before)]:
        old, new = before.get(key, missing), after.get(key, missing)
        if old != new:
            changes.append(
                {
                    "key": shown_text(key),
                    "old": "(none)" if old is missing else shown_json(old),
                    "new": "(removed)" if new is missing else shown_json(new),
                }
            )
    return changes


@register.filter
def external_request(approval: Any) -> dict[str, Any]:
    """Return what an external agent said about its gated call (description, metadata); {} for other calls."""
    if approval.run.kind != "external":
        return {}
    return _external_request(approval.id, approval.run_id)


@register.simple_tag
def event_time(value: datetime) -> str:
    """Return a timeline entry's <time>: machine-readable, the full time on hover, the clock time shown.

    One tag instead of three `date` filters: a run page of hundreds of events spent a quarter
    of its time formatting dates.
    """
    moment = timezone.localtime(value)
    return format_html(
        '<time class="meta" datetime="{}" title="{} UTC">{}</time>',
        moment.isoformat(),
        moment.strftime("%Y-%m-%d %H:%M:%S"),
        moment.strftime("%H:%M:%S"),
    )


# -- timeline entries ---------------------------------------------------------------------------
# A stored RunEvent never changes, and its entry shows nothing of who looks: each is rendered once
# per process and kept, up to a few MB of HTML, so a run page of 200 events renders only the new ones.
TIMELINE_CACHE_CHARS = 8_000_000
_TIMELINE_ENTRY_MAX_CHARS = 64_000  # an event with huge arguments is rendered each time, not kept
_entries: LRUCache[tuple[Any, ...], SafeString] = LRUCache(maxsize=TIMELINE_CACHE_CHARS, getsizeof=len)
_entries_lock = threading.Lock()  # the web process serves pages on several threads


@register.simple_tag
def timeline_entry(event: Any) -> SafeString:
    """Return one timeline entry (dashboard/_event.html) of a stored event, rendered once per process.

    Keyed by the row's id with its run, seq and time: an id reused after a rollback (SQLite) or
    a database rebuilt under a running process names another event, and finds no entry.
    """
    if event.pk is None:
        return _render_entry(event)
    key = (event.pk, event.run_id, event.seq, event.created_at)
    with _entries_lock:
        html = _entries.get(key)
    if html is None:
        html = _render_entry(event)
        if len(html) <= _TIMELINE_ENTRY_MAX_CHARS:
            with _entries_lock:
                _entries[key] = html
    return html


def _render_entry(event: Any) -> SafeString:
    return SafeString(render_to_string("dashboard/_event.html", {"event": event}))
