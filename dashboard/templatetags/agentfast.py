"""Template filters of the dashboard: short relative times and pretty, escaped JSON."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()


def _elapsed(value: datetime) -> str:
    seconds = max(0, int((timezone.now() - value).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


@register.filter
def ago(value: datetime | None) -> str:
    """Render a past moment as '2 s ago', '3 min ago', '5 h ago' (static/js/app.js keeps it fresh)."""
    return f"{_elapsed(value)} ago" if value else ""


@register.filter
def waited(value: datetime | None) -> str:
    """Render how long something has waited since a moment: '2 s', '3 min'."""
    return _elapsed(value) if value else ""


@register.filter
def pretty_json(value: Any) -> str:
    """Return indented JSON as plain text; autoescape makes any markup in it harmless."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


@register.filter
def compact_json(value: Any) -> str:
    """Return one-line JSON as plain text, for tables."""
    return json.dumps(value, ensure_ascii=False, default=str)
