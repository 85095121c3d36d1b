from __future__ import annotations

from typing import Any

from agents.models import SideEffect


def sideeffect_record(*, tool: str, idempotency_key: str, arguments: dict[str, Any]) -> SideEffect:
    """Journal one real-world effect of a demo tool."""
    return SideEffect.objects.create(tool=tool, idempotency_key=idempotency_key, arguments=arguments)
