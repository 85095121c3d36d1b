"""Template filters of the runs pages: how long a run took, how long an approval waited."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils import timezone

from agents.models import Approval, Run

register = template.Library()


def span_text(span: timedelta) -> str:
    """Render a duration as '850 ms', '12 s', '3 min 4 s', '2 h 5 min' or '3 d 4 h'."""
    seconds = max(span.total_seconds(), 0.0)
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{round(seconds)} s"
    minutes, second = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {second} s" if second else f"{minutes} min"
    hours, minute = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minute} min" if minute else f"{hours} h"
    days, hour = divmod(hours, 24)
    return f"{days} d {hour} h" if hour else f"{days} d"


def _until(end: datetime | None) -> datetime:
    return end or timezone.now()


@register.filter
def run_duration(run: Run) -> str:
    """Return how long a run took, or has taken so far (a run's last change ends a finished one)."""
    return span_text(_until(run.updated_at if run.is_terminal else None) - run.created_at)


@register.filter
def waited(approval: Approval) -> str:
    """Return how long an approval waited for its decision, or has waited so far."""
    return span_text(_until(approval.decided_at) - approval.created_at)


@register.filter
def short_id(value: str) -> str:
    """Return the last 8 characters of an id (a ULID's random tail tells runs apart)."""
    return str(value)[-8:]


@register.filter
def agent_name(run: Run) -> str:
    """Return the agent's name as people read it (a composed agent's saved name, or its tools and model)."""
    from dashboard.web.playground import agent_label

    return agent_label(run.agent, run.agent_config)
