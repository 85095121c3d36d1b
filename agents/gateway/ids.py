"""Identifiers of external sessions and calls, derived (never random) so a retry finds the same rows."""

from __future__ import annotations

import hashlib
import re

from agents import ids

RUN_PREFIX = "ext_"
_RUN_DIGEST_CHARS = 32
RUN_ID_CHARS = len(RUN_PREFIX) + _RUN_DIGEST_CHARS
APPROVAL_PREFIX = "appr_" + RUN_PREFIX  # as agents.ids.approval_id writes it
_DIGEST_PREFIX = "h_"
_CALL_DIGEST_CHARS = 40
_DIGESTED = re.compile(rf"{_DIGEST_PREFIX}[0-9a-f]{{{_CALL_DIGEST_CHARS}}}")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def run_id(*, owner: str, agent: str, session: str) -> str:
    """Return the run of one session of one agent, as asked by one account (owners never share runs)."""
    return RUN_PREFIX + _digest(owner, agent, session)[:_RUN_DIGEST_CHARS]


def call_id(external_call_id: str) -> str:
    """Return the call id stored for an external one: itself when URL-safe, else a digest of it."""
    # One shaped like a digest is digested too: sent as is, it would be the call it digests.
    if ids.is_safe_call_id(external_call_id) and not _DIGESTED.fullmatch(external_call_id):
        return external_call_id
    return _DIGEST_PREFIX + _digest(external_call_id)[:_CALL_DIGEST_CHARS]


def approval_id(*, owner: str, agent: str, session: str, external_call_id: str) -> str:
    """Return the one approval id of an external call (≤ 106 characters, URL-safe)."""
    return ids.approval_id(run_id(owner=owner, agent=agent, session=session), call_id(external_call_id))


def split(approval_id: str) -> tuple[str, str] | None:
    """Return (run id, call id) of an external approval id, or None if it is not one."""
    if not approval_id.startswith(APPROVAL_PREFIX) or len(approval_id) <= len("appr_") + RUN_ID_CHARS + 1:
        return None
    run = approval_id[len("appr_") : len("appr_") + RUN_ID_CHARS]
    rest = approval_id[len("appr_") + RUN_ID_CHARS :]
    if not rest.startswith("_"):
        return None
    return run, rest[1:]
