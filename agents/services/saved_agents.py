"""Agents composed in the playground and kept under a name by the person who composed them."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from agents import text
from agents.models import SavedAgent
from agents.services.errors import InvalidInput, unsafe_text_refused

MAX_NAME_CHARS = 80


def savedagent_save(*, owner: User, name: str, definition: dict[str, Any]) -> SavedAgent:
    """Save a composed agent under a name; saving a name again replaces its definition (the owner's own)."""
    name = " ".join(str(name).split())
    if not name:
        raise InvalidInput("name the agent to save it", field="name")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidInput(f"a name has at most {MAX_NAME_CHARS} characters", field="name")
    with unsafe_text_refused():
        text.require_plain_name(name, field="name")
    with transaction.atomic():
        saved, _ = SavedAgent.objects.update_or_create(owner=owner, name=name, defaults={"definition": definition})
    return saved
