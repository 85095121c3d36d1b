"""Identifiers: run ids are ULIDs (sortable by creation), approval ids are derived."""

from __future__ import annotations

import os
import re
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_SAFE_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # fullmatch: a `$` lets "call_1\n" through


def ulid() -> str:
    """Return a new ULID: 48 bits of milliseconds then 80 random bits, Crockford base32."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_run_id() -> str:
    return f"run_{ulid()}"


def approval_id(run_id: str, call_id: str) -> str:
    """Return the one approval id a tool call of a run can ever have (invariant 1)."""
    return f"appr_{run_id}_{call_id}"


def is_safe_call_id(call_id: str) -> bool:
    """Return whether a model-proposed call id can go into an approval id and a URL."""
    return _SAFE_CALL_ID.fullmatch(call_id) is not None
