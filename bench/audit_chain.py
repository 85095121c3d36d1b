"""`python -m bench.audit_chain`: what chaining the audit costs a write, and how fast verify reads.

On the bench's fresh database (SQLite in var/bench/, or DATABASE_URL=postgres://…/<…bench…>),
interleaved so load on the machine hits both alike:
  plain     one transaction: INSERT of an audit row (what a decision paid before the chain)
  chained   one transaction: services.audit_append (lock, read the head, hash, INSERT)
  verify    services.audit_verify over every entry written, entries per second
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

from bench import setup

BLOCK = 50


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit_chain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=2000, help="timed writes of each kind (default 2000)")
    args = parser.parse_args(argv)
    if args.writes < 1:
        parser.error("--writes must be at least 1")
    try:
        target = setup.prepare()
    except setup.BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    plain, chained = _writes(args.writes)
    entries, seconds = _verify()
    print(f"audit chain bench · {target.engine} · {target.label} · {len(plain)} writes of each kind")
    print(f"{'write (one transaction)':<28}{'p50 ms':>9}{'p95 ms':>9}")
    for label, samples in (("plain INSERT", plain), ("audit_append (chained)", chained)):
        print(f"{label:<28}{_q(samples, 0.5):>9.3f}{_q(samples, 0.95):>9.3f}")
    print(f"{'added by the chain, p50':<28}{_q(chained, 0.5) - _q(plain, 0.5):>9.3f}")
    print(f"verify: {entries} entries in {seconds * 1000:.0f} ms ({entries / seconds:,.0f} entries/s)")
    return 0


def _writes(count: int) -> tuple[list[float], list[float]]:
    from django.db import transaction

    from agents import services
    from agents.models import AuditEntry

    fields = {
        "approval_id": "appr_bench",
        "action": "approved",
        "actor": "bench",
        "source": "api",
        "outcome": "decided",
    }
    plain: list[float] = []
    chained: list[float] = []
    # Blocks of each kind in turn; the plain rows of a block are deleted before the chained
    # block, since the chain's head is the newest row.
    for block in range(max(1, round(count / BLOCK)) + 1):  # the first block of each warms up
        for _ in range(BLOCK):
            t0 = time.perf_counter()
            with transaction.atomic():
                # prev_hash is unique: a random value keeps the plain rows apart.
                AuditEntry.objects.create(**fields, detail={"note": "plain"}, prev_hash=uuid.uuid4().hex)
            if block:
                plain.append((time.perf_counter() - t0) * 1000)
        AuditEntry.objects.filter(detail__note="plain").delete()
        for _ in range(BLOCK):
            t0 = time.perf_counter()
            with transaction.atomic():
                services.audit_append(**fields, detail={"note": "chained"})
            if block:
                chained.append((time.perf_counter() - t0) * 1000)
    return plain, chained


def _verify() -> tuple[int, float]:
    from agents import services

    t0 = time.perf_counter()
    report = services.audit_verify()
    seconds = time.perf_counter() - t0
    if not report.ok:
        raise SystemExit(f"bench: the chain does not verify: {report.message}")
    return report.entries, seconds


def _q(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[round(q * 100) - 1] if q < 1 else max(samples)


if __name__ == "__main__":
    raise SystemExit(main())
