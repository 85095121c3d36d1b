"""Errors services raise; each carries a stable code that the CLI and the API report."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agents.text import UnsafeText


class ServiceError(Exception):
    code = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


@contextmanager
def unsafe_text_refused() -> Iterator[None]:
    """Raise the block's UnsafeText (a person's text that cannot be stored) as InvalidInput, naming its field."""
    try:
        yield
    except UnsafeText as exc:
        raise InvalidInput(exc.message, field=exc.field) from None


class NotFound(ServiceError):
    code = "not_found"


class InvalidInput(ServiceError):
    code = "invalid"


class AlreadyDecided(ServiceError):
    """A different decision was already taken: the first decision wins (invariant 3)."""

    code = "already_decided"


class WrongState(ServiceError):
    """The thing exists but is not in a state that allows this (e.g. resume a completed run)."""

    code = "wrong_state"


class LeaseLost(ServiceError):
    """Another driver took over this run; the caller must stop writing (invariant 5)."""

    code = "lease_lost"


class NotPermitted(ServiceError):
    """This person may not decide this approval (not an approver, four eyes); audited."""

    code = "not_permitted"


class Unavailable(ServiceError):
    """The server cannot do this until its operator fixes something of its own (an unreadable agentfast.yaml)."""

    code = "unavailable"


class DigestMismatch(ServiceError):
    """The arguments changed since the reviewer saw them; `arguments_digest` says what they are now."""

    code = "digest_mismatch"
