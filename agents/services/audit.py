"""The audit log as a hash chain: the one writer of audit rows, and the check of the chain.

Each entry stores the hash of the entry before it (`prev_hash`; 64 zeros for the first)
and its own `hash = sha256(prev_hash + canonical JSON of its fields)`. Changing, removing
or reordering a stored entry breaks the chain at that entry, which `audit_verify` names.
Removing the newest entries leaves a shorter valid chain: keep the head hash elsewhere to
detect that.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

from django.db import connection, transaction
from django.utils import timezone

from agents import sql, text
from agents.models import AuditEntry

if TYPE_CHECKING:
    from django.db.models import Field

GENESIS = "0" * 64
# The chain's lock on PostgreSQL: any fixed 64-bit key works; this one spells "afaudit" so it
# is recognizable in pg_locks.
CHAIN_LOCK = int.from_bytes(b"afaudit", "big")
HASHED_FIELDS = (
    "approval_id",
    "run_id",
    "tool",
    "action",
    "actor",
    "on_behalf_of",
    "source",
    "origin",
    "outcome",
    "detail",
    "created_at",
)
_TEXT_FIELDS = ("approval_id", "run_id", "tool", "action", "actor", "on_behalf_of", "source", "origin", "outcome")


def audit_append(
    *,
    approval_id: str,
    action: str,
    actor: str,
    source: str,
    outcome: str,
    run_id: str = "",
    tool: str = "",
    on_behalf_of: str = "",
    origin: str = "",
    detail: Mapping[str, Any] | None = None,
    chain_locked: bool = False,
) -> AuditEntry:
    """Append an entry to the audit chain, inside the caller's transaction if there is one.

    Whatever the caller passes is repaired and cut to its column, so auditing never fails
    on malformed input. The hash covers the values exactly as they are stored.
    `chain_locked`: the caller's transaction took the chain's lock already (CHAIN_LOCK,
    agents.sql.decision), which saves a statement.
    """
    values: dict[str, Any] = {
        "approval_id": approval_id,
        "run_id": run_id,
        "tool": tool,
        "action": str(action),
        "actor": actor.strip() or "(anonymous)",
        "on_behalf_of": on_behalf_of,
        "source": source,
        "origin": origin,
        "outcome": str(outcome),
    }
    fields = {name: _fit(name, value) for name, value in values.items()}
    entry = AuditEntry(**fields, detail=text.repair(dict(detail or {})))
    # No savepoint: a failed insert fails the caller's transaction anyway, and on PostgreSQL a
    # savepoint would cost two more round trips while the chain is locked.
    locked = chain_locked and connection.in_atomic_block  # a lock outside a transaction ended with its statement
    with transaction.atomic(savepoint=False):
        if not locked:
            _lock_chain()
        # The time is taken under the lock, so created_at never goes backwards along the chain.
        entry.created_at = timezone.now()
        if connection.vendor == "postgresql":
            _insert_hashed_by_the_database(entry)
        else:
            entry.prev_hash = _head()  # a statement after the lock: it sees the head the last writer committed
            entry.hash = entry_hash(entry.prev_hash, entry_fields(entry))
            result = sql.chain.inserting(entry, returning=("id",)).run()
            assert result is not None  # an insert returns its row
            entry.pk = result.head["id"]
        entry._state.adding, entry._state.db = False, AuditEntry.objects.db  # as the ORM leaves a row it saved
    return entry


def _insert_hashed_by_the_database(entry: AuditEntry) -> None:
    """Insert the entry with PostgreSQL reading the head and hashing; check its hash is the one computed here."""
    fields = entry_fields(entry)
    entry.pk, entry.prev_hash, entry.hash = sql.audit_insert(entry, canonical=canonical_json(fields), genesis=GENESIS)
    if entry.hash != entry_hash(entry.prev_hash, fields):
        # Never write a link that audit_verify would call altered: fail the transaction instead.
        raise RuntimeError(f"the database hashed audit entry {entry.pk} unlike entry_hash: not written")


def _fit(name: str, value: str) -> str:
    """Return text repaired and cut to its column's length."""
    column = cast("Field[Any, Any]", AuditEntry._meta.get_field(name))  # a text column, not a relation
    return text.repair(value)[: column.max_length]


def _lock_chain() -> None:
    """Hold the chain's head until the transaction ends, so two writers cannot both extend it.

    PostgreSQL: a transaction-level advisory lock, released at commit or rollback. SQLite:
    every write transaction is BEGIN IMMEDIATE (settings), which already admits one writer
    at a time, so the head read below cannot change before the insert commits.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CHAIN_LOCK])


def _head() -> str:
    return sql.audit_head() or GENESIS


# -- the hash -------------------------------------------------------------------------


def entry_fields(entry: Any) -> dict[str, Any]:
    """Return the hashed fields of an entry (a model instance, or a historical one in a migration)."""
    return {name: getattr(entry, name) for name in HASHED_FIELDS}


def entry_hash(prev_hash: str, fields: Mapping[str, Any], *, legacy: bool = False) -> str:
    """Return sha256 hex of the previous hash followed by the canonical JSON of the fields."""
    return hashlib.sha256((prev_hash + canonical_json(fields, legacy=legacy)).encode("utf-8")).hexdigest()


def canonical_json(fields: Mapping[str, Any], *, legacy: bool = False) -> str:
    """Serialize fields the same way whatever database stored them.

    Keys are sorted (jsonb reorders them), times are UTC at microsecond precision (what
    both databases keep), and integral floats are written as the integer their shortest
    spelling names (jsonb keeps the number json.dumps wrote: it reads 1e23 back as 1 and 23
    zeros, and 1.0 as 1.0 or 1 depending on the driver). `legacy`: as entries were hashed
    before, with an integral float's exact binary value (99999999999999991611392 for 1e23).
    """
    normal = {name: _normal(value, legacy) for name, value in fields.items()}
    return json.dumps(normal, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _normal(value: Any, legacy: bool) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, float) and value.is_integer():
        return int(value) if legacy else int(Decimal(repr(value)))
    if isinstance(value, dict):
        return {str(key): _normal(item, legacy) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normal(item, legacy) for item in value]
    return value


# -- the check ------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainReport:
    """What `audit_verify` found: the entries checked, and the first break (None: intact)."""

    entries: int
    head: str
    problem: str = ""  # altered | removed | reordered
    entry_id: int | None = None
    entry_created_at: datetime | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem


def audit_verify(*, chunk_size: int = 2000) -> ChainReport:
    """Recompute the chain in id order; report the first entry altered, removed or reordered (reads only)."""
    return _walk(_in_id_order(chunk_size))


def _in_id_order(chunk_size: int) -> Iterator[AuditEntry]:
    """Yield every entry in id order, a page at a time by id.

    Pages, not one cursor held across the table: a million entries read without holding them
    all, and without a cursor that outlives its transaction (which a pooler in transaction
    mode drops). Entries appended meanwhile come last, and are checked too.
    """
    entries = AuditEntry.objects.order_by("id").only("id", "prev_hash", "hash", *HASHED_FIELDS)
    after = 0
    while True:
        page = list(entries.filter(id__gt=after)[:chunk_size])
        yield from page
        if len(page) < chunk_size:
            return
        after = page[-1].pk


def _walk(entries: Iterable[AuditEntry]) -> ChainReport:
    expected, count = GENESIS, 0
    for entry in entries:
        if not _hash_matches(entry):
            return _broken(count, expected, entry, "altered", "its content does not match its hash")
        if entry.prev_hash != expected:
            return _gap(count, expected, entry)
        expected, count = entry.hash, count + 1
    return ChainReport(entries=count, head=expected)


def _hash_matches(entry: AuditEntry) -> bool:
    """Return whether an entry's content gives its hash (as hashed now, or as before big floats were spelled out)."""
    fields = entry_fields(entry)
    if entry_hash(entry.prev_hash, fields) == entry.hash:
        return True
    # Only entries holding an integral float of 2**53 or more hash differently in the two forms;
    # SQLite gives such floats back as floats, so their entries written before still verify.
    return entry_hash(entry.prev_hash, fields, legacy=True) == entry.hash


def _gap(count: int, expected: str, entry: AuditEntry) -> ChainReport:
    """Name a break between intact entries: the one it links to is elsewhere (reordered) or gone (removed)."""
    if entry.prev_hash == GENESIS:
        return _broken(count, expected, entry, "reordered", "it claims to be the first entry")
    linked = AuditEntry.objects.filter(hash=entry.prev_hash).values_list("id", flat=True).first()
    if linked is not None:
        return _broken(count, expected, entry, "reordered", f"it follows entry #{linked} in the chain")
    return _broken(count, expected, entry, "removed", "the entry before it in the chain is missing")


def _broken(count: int, head: str, entry: AuditEntry, problem: str, why: str) -> ChainReport:
    return ChainReport(
        entries=count,
        head=head,
        problem=problem,
        entry_id=entry.pk,
        entry_created_at=entry.created_at,
        message=f"entry #{entry.pk} at {_time_text(entry.created_at)} {problem}: {why}",
    )


def _time_text(moment: datetime | None) -> str:
    """Return an entry's time as ISO 8601; one the database gives back unreadable (SQLite's text overwritten) says so."""
    return moment.isoformat() if moment is not None else "(an unreadable time)"
