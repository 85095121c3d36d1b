"""`python -m bench.scale`: the pages, the sweeper and the CSV export over a large database.

Builds --pending paused runs (one pending approval each, asked over a day, cloned row by row
from a run the engine really paused: run, messages, tool call, approval, events), --decided completed runs
(cloned from a run the engine really resumed, each approval decided 0 s to hours after it was
asked), one run with --events events, and --audit audit entries (cloned from a real decision, spread over a year, 200
people, 6 tools, mixed outcomes), and --deliveries notification deliveries (over a year, most
delivered), in bulk_create batches. Then, signed in as an admin
through Django's test client, --repeat requests of each page; one sweeper tick --repeat
times; --repeat Prometheus scrapes of /metrics; and the CSV export of the whole audit through a real daphne process.
Postgres by default (DATABASE_URL naming a database containing "bench"); --sqlite allowed.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from bench import setup

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/agentfast_bench_scale"
BATCH = 2000
AGENTS = [f"bench-{n}" for n in range(10)]  # the filtered inbox page picks one of ten
TOOLS = ["send_email", "issue_refund", "delete_account", "update_address", "create_ticket", "close_ticket"]
PEOPLE = [f"reviewer{n:03d}" for n in range(200)]
DEEP = 5000  # how far into the API's list its deep pages start (page 101 of 50 rows)
# A scrape has no target in the issue: it is timed against Prometheus' default timeout of 10 s.
TARGETS = {
    "page": 50.0,
    "audit": 100.0,
    "scrape": 10_000.0,
    "sweeper": 100.0,
    "csv_rows_per_s": 50_000.0,
    "first_byte_s": 1.0,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=100_000, help="paused runs, one pending approval each")
    parser.add_argument("--decided", type=int, default=100_000, help="completed runs with a decided approval each")
    parser.add_argument("--audit", type=int, default=1_000_000, help="audit entries (default 1,000,000)")
    parser.add_argument("--events", type=int, default=1000, help="events of the one long run (default 1000)")
    parser.add_argument(
        "--deliveries", type=int, default=300_000, help="notification deliveries, over a year (default 300,000)"
    )
    parser.add_argument("--repeat", type=int, default=30, help="timed requests of each page (default 30)")
    parser.add_argument("--no-csv", action="store_true", help="skip the CSV export through daphne")
    parser.add_argument("--verbose", action="store_true", help="print EXPLAIN of each page's and the sweeper's queries")
    parser.add_argument("--sqlite", action="store_true", help="on a fresh SQLite file in var/bench/ instead")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the database a previous run built at these sizes (migrating it) instead of building it again",
    )
    args = parser.parse_args(argv)
    if min(args.pending, args.decided, args.audit, args.events, args.deliveries, args.repeat) < 1:
        parser.error("--pending, --decided, --audit, --events, --deliveries and --repeat must be at least 1")
    if args.pending <= DEEP:
        parser.error(f"--pending must be more than {DEEP:,}: the API's deep pages start there")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sqlite:
        os.environ.pop("DATABASE_URL", None)  # the bench's own SQLite file
    else:
        os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    return setup.run(_main, args)


def _main(args: argparse.Namespace) -> int:
    target = setup.prepare(fresh=not args.reuse)
    setup.start_redis()
    with setup.django_migrated(target):
        print(render(_run(args, target)))
    return 0


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# -- building the data ----------------------------------------------------------------------


@contextmanager
def _dates_settable(*models: Any) -> Iterator[None]:
    """Let bulk_create keep the created_at we give (auto_now_add would overwrite it)."""
    fields = [m._meta.get_field("created_at") for m in models]
    for f in fields:
        f.auto_now_add = False
    try:
        yield
    finally:
        for f in fields:
            f.auto_now_add = True


def build(args: argparse.Namespace) -> dict[str, Any]:
    from agents.models import AuditEntry, Run
    from bench import measure

    if args.reuse:
        kept = _kept(args)
        if kept is not None:
            return kept
        progress("--reuse: no database of these sizes to keep, building one")
    t0 = time.perf_counter()
    decided = measure.check_flow()  # one real decision: the decided runs' and the audit entries' template
    template = measure.paused_run()
    progress(f"building {args.pending:,} paused runs with a pending approval each")
    _clone_runs(template, args.pending)
    _restrict(args.pending)
    progress(f"building {args.decided:,} completed runs with a decided approval each")
    _clone_runs(decided, args.decided, decided=True)
    t1 = time.perf_counter()
    long_run = measure.paused_run()
    _add_events(long_run, args.events)
    progress(f"building {args.audit:,} audit entries")
    _clone_audit(AuditEntry.objects.order_by("id").first(), args.audit)
    t2 = time.perf_counter()
    progress(f"building {args.deliveries:,} deliveries")
    _add_deliveries(args.deliveries)
    t3 = time.perf_counter()
    _analyze()
    return {
        "long_run": long_run,
        "runs_seconds": t1 - t0,
        "audit_seconds": t2 - t1,
        "deliveries_seconds": t3 - t2,
        "seconds": time.perf_counter() - t0,
        "runs": Run.objects.count(),
        "audit": args.audit,
    }


def _kept(args: argparse.Namespace) -> dict[str, Any] | None:
    """Return what a previous build left, when it has the sizes asked for (None: build afresh)."""
    from agents.models import Approval, AuditEntry, Run
    from agents.notify.models import Delivery

    pending = Approval.objects.filter(status=Approval.Status.PENDING).count()
    decided = Approval.objects.exclude(status=Approval.Status.PENDING).count()
    audit = AuditEntry.objects.count()
    long_run = Run.objects.order_by("-last_event_seq").values_list("id", "last_event_seq").first()
    # The clones and the long run's template each hold a pending approval; a kept audit has the clones and one more.
    # The decided runs' template is decided too.
    if not (args.pending <= pending <= args.pending + 3 and args.decided <= decided <= args.decided + 1):
        return None
    if not args.audit <= audit <= args.audit + 2:
        return None
    if long_run is None or long_run[1] < args.events:
        return None
    if (kept_deliveries := Delivery.objects.count()) != args.deliveries:  # built by an older bench, or of another size
        progress(f"--reuse: {kept_deliveries:,} deliveries kept; building {args.deliveries:,} instead")
        Delivery.objects.all().delete()
        _add_deliveries(args.deliveries)
    if not Approval.objects.filter(status=Approval.Status.PENDING).exclude(approvers=[]).exists():
        _restrict(args.pending)
    _analyze()
    progress(f"--reuse: kept {pending:,} pending approvals and {audit:,} audit entries")
    return {
        "long_run": long_run[0],
        "runs_seconds": 0.0,
        "audit_seconds": 0.0,
        "seconds": 0.0,
        "runs": Run.objects.count(),
        "audit": audit,
        "reused": True,
    }


# Who the restricted approvals wait for: a group the bench admin is not in, the admin by name
# (with a group), and four eyes on runs the admin did not start. The inbox's "For me" filters them.
RESTRICTED = (
    ("not for the admin", {"approvers": ["finance"]}),
    ("the admin by name", {"approvers": ["user:bench-admin", "managers"]}),
    ("four eyes", {"four_eyes": True}),
)


def _restrict(count: int) -> None:
    """Make every tenth pending approval wait for someone in particular (a third each of RESTRICTED)."""
    from django.db import transaction

    from agents.models import Approval

    waiting = Approval.objects.filter(status=Approval.Status.PENDING).order_by("created_at", "id")
    ids = list(waiting.values_list("pk", flat=True))[:count:10]
    with transaction.atomic():
        for index, (_, changes) in enumerate(RESTRICTED):
            chosen = ids[index :: len(RESTRICTED)]
            for start in range(0, len(chosen), BATCH):
                Approval.objects.filter(pk__in=chosen[start : start + BATCH]).update(**changes)
    progress(f"  {len(ids):,} pending approvals restricted (approvers or four eyes)")


def _clone_runs(template_id: str, count: int, *, decided: bool = False) -> None:
    """Clone a run `count` times, row by row; decided: each approval asked 0 s to hours before its decision."""
    from django.db import transaction

    from agents import ids
    from agents.models import Approval, Message, Run, RunEvent, ToolCall

    run = Run.objects.get(pk=template_id)
    messages = list(Message.objects.filter(run=run))
    calls = list(ToolCall.objects.filter(run=run))
    approvals = {a.tool_call_id: a for a in Approval.objects.filter(run=run)}
    events = list(RunEvent.objects.filter(run=run))
    rng = random.Random(12)
    done = 0
    while done < count:
        size = min(BATCH, count - done)
        new_runs = [_copy(run, id=ids.new_run_id(), agent=rng.choice(AGENTS)) for _ in range(size)]
        with transaction.atomic():
            Run.objects.bulk_create(new_runs)
            Message.objects.bulk_create(_copy(m, id=None, run_id=r.id) for r in new_runs for m in messages)
            RunEvent.objects.bulk_create(_copy(e, id=None, run_id=r.id) for r in new_runs for e in events)
            new_calls = ToolCall.objects.bulk_create(_copy(c, id=None, run_id=r.id) for r in new_runs for c in calls)
            with _dates_settable(Approval):
                Approval.objects.bulk_create(
                    _copy(
                        approvals[old.pk],
                        id=ids.approval_id(new.run_id, new.call_id),
                        run_id=new.run_id,
                        tool_call_id=new.pk,
                        **_asked(approvals[old.pk], rng, decided),
                    )
                    for old, new in zip(calls * size, new_calls, strict=True)
                    if old.pk in approvals
                )
        done += size
        if done % 20_000 < BATCH:
            progress(f"  {done:,} runs")


def _asked(approval: Any, rng: random.Random, decided: bool) -> dict[str, Any]:
    """Return when a clone was asked: pending, over the day before its template; decided, about ten minutes
    before its decision on average.

    Each its own time, as calls pausing one by one have: with one time for every clone the
    lists' (created_at, id) order could not be read off an index, and a filtered list sorted
    every pending approval (the API's list by agent: 255 ms, not what a real inbox costs).
    """
    if not decided:
        return {"created_at": approval.created_at - timedelta(seconds=rng.uniform(0, 86_400))}
    return {"created_at": approval.decided_at - timedelta(seconds=rng.expovariate(1 / 600))}


def _copy(row: Any, **changes: Any) -> Any:
    """Return an unsaved copy of a model instance with some fields changed."""
    values = {f.attname: getattr(row, f.attname) for f in row._meta.concrete_fields}
    values.update(changes)
    return type(row)(**values)


def _add_events(run_id: str, count: int) -> None:
    from django.db import transaction

    from agents.models import Run, RunEvent

    run = Run.objects.get(pk=run_id)
    first = run.last_event_seq + 1
    with transaction.atomic():
        RunEvent.objects.bulk_create(
            (
                RunEvent(
                    run_id=run_id,
                    seq=first + n,
                    type=RunEvent.Type.MESSAGE,
                    data={"role": "assistant", "content": f"Step {n}: checked."},
                )
                for n in range(count)
            ),
            batch_size=BATCH,
        )
        Run.objects.filter(pk=run_id).update(last_event_seq=first + count - 1)


def _over_a_year(model: Any, count: int, row: Callable[[int, datetime], Any], what: str) -> None:
    """Store `count` rows of `model`, row n made by `row(n, created_at)`, created evenly over the past year, in batches."""
    from django.db import transaction
    from django.utils import timezone

    start = timezone.now() - timedelta(days=365)
    step = timedelta(days=365) / count
    done = 0
    with _dates_settable(model):
        while done < count:
            size = min(BATCH * 5, count - done)
            rows = [row(n, start + step * n) for n in range(done, done + size)]
            with transaction.atomic():
                model.objects.bulk_create(rows)
            done += size
            if done % 200_000 < BATCH * 5:
                progress(f"  {done:,} {what}")


def _clone_audit(template: Any, count: int) -> None:
    from agents.models import AuditEntry

    rng = random.Random(7)
    outcomes = [AuditEntry.Outcome.DECIDED] * 8 + [AuditEntry.Outcome.IDEMPOTENT, AuditEntry.Outcome.NOT_PERMITTED]

    def entry(n: int, created_at: datetime) -> AuditEntry:
        return _copy(
            template,
            id=None,
            actor=rng.choice(PEOPLE),
            tool=rng.choice(TOOLS),
            action=rng.choice(("approved", "approved", "rejected")),
            outcome=rng.choice(outcomes),
            approval_id=f"appr_run_{n:026d}_call_1",
            run_id=f"run_{n:026d}",
            created_at=created_at,
            # prev_hash is unique (the chain refuses a fork): each clone gets its own.
            prev_hash=f"{n + 1:064x}",
            hash=f"{n + 2:064x}",
        )

    _over_a_year(AuditEntry, count, entry, "audit entries")


def _add_deliveries(count: int) -> None:
    """Store `count` deliveries spread over a year: webhooks, mails and Slack messages, most delivered."""
    from agents.notify.models import Delivery

    rng = random.Random(11)
    kinds = [Delivery.Kind.WEBHOOK, Delivery.Kind.EMAIL, Delivery.Kind.SLACK]
    statuses = [Delivery.Status.DELIVERED] * 16 + [Delivery.Status.FAILED, Delivery.Status.SUPERSEDED]
    statuses += [Delivery.Status.PENDING]

    def delivery(n: int, created_at: datetime) -> Delivery:
        status = rng.choice(statuses)
        return Delivery(
            kind=rng.choice(kinds),
            target=rng.choice(PEOPLE),
            event_type=rng.choice(("approval.required", "approval.decided")),
            approval_id=f"appr_run_{n:026d}_call_1",
            payload={"type": "approval.required", "data": {"tool": rng.choice(TOOLS)}},
            status=status,
            attempts=1,
            next_attempt_at=created_at if status == Delivery.Status.PENDING else None,
            created_at=created_at,
        )

    _over_a_year(Delivery, count, delivery, "deliveries")


def _analyze() -> None:
    from django.db import connection

    # VACUUM too on PostgreSQL: a live database's autovacuum keeps the visibility map current,
    # which index-only scans need; a bulk-loaded one has not had it yet.
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")


# -- measuring ---------------------------------------------------------------------------------


def _run(args: argparse.Namespace, target: setup.Target) -> dict[str, Any]:
    from agents import services

    started = time.perf_counter()
    built = build(args)
    progress(f"built in {built['seconds']:.1f} s; timing the pages ({args.repeat} requests each)")
    from django.contrib.auth.models import User

    admin = User.objects.filter(username="bench-admin").first()  # kept by --reuse
    if admin is None:
        admin, _ = services.user_create(username="bench-admin", role="admin")
    client = _client(admin)
    pages = _pages(built["long_run"])
    results: dict[str, Any] = {"built": built, "pages": {}, "explain": {}}
    for label, (url, kind) in pages.items():
        results["pages"][label] = {"kind": kind, "url": url, **_time_page(client, url, args.repeat)}
        if args.verbose:
            results["explain"][label] = _explain(client, url)
    progress(f"timing /metrics ({args.repeat} scrapes)")
    results["pages"]["/metrics scrape (Prometheus)"] = {
        "kind": "scrape",
        "url": "/metrics",
        **_time_page(_scraper(admin), "/metrics", args.repeat),
    }
    progress(f"timing a sweeper tick ({args.repeat} ticks)")
    results["sweeper"] = _time_sweeper(args.repeat)
    progress(f"timing a sweeper tick with every pending approval reminding, none due ({args.repeat} ticks)")
    results["sweeper_reminding"] = _time_sweeper_reminding(args.repeat)
    if args.verbose:
        from agents import sweeper

        results["explain"]["sweeper tick"] = _explain_queries(sweeper.sweep)
    if not args.no_csv:
        progress(f"exporting {args.audit:,} audit entries as CSV through daphne")
        results["csv"] = _csv_export(client)
    results["meta"] = {
        "database": f"{target.engine} ({target.label})",
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "seconds": time.perf_counter() - started,
        "args": vars(args),
    }
    return results


def _client(admin: Any) -> Any:
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")  # a host the settings allow
    client.force_login(admin)
    return client


def _scraper(admin: Any) -> Any:
    """Return a client holding an admin's API token, as Prometheus would."""
    from django.test import Client

    from agents import services

    _, token = services.token_create(username=admin.username, name=f"bench scrape {time.time_ns()}")
    return Client(HTTP_HOST="127.0.0.1", headers={"Authorization": f"Bearer {token}"})


def _pages(long_run: str) -> dict[str, tuple[str, str]]:
    """Label → (URL, which target applies)."""
    return {
        "inbox, first page": ("/", "page"),
        f"inbox, filtered (agent={AGENTS[3]})": (f"/?agent={AGENTS[3]}", "page"),
        "inbox, page 100": ("/?page=100", "page"),
        "API approvals list (pending)": ("/api/approvals?status=pending", "page"),
        f"API approvals list (agent={AGENTS[3]})": (f"/api/approvals?status=pending&agent={AGENTS[3]}", "page"),
        f"API approvals list, offset {DEEP:,}": (f"/api/approvals?status=pending&offset={DEEP}", "page"),
        f"API approvals list, cursor at {DEEP:,}": (f"/api/approvals?status=pending&cursor={_deep_cursor()}", "page"),
        # On PostgreSQL trigram indexes serve a word few rows hold (migration 0030); SQLite reads every row.
        "inbox, search (a word every call holds)": ("/?q=refund", "page"),
        "inbox, search (a word no call holds)": ("/?q=zzzz", "page"),
        "runs page": ("/runs", "page"),
        "runs page (status=suspended)": ("/runs?status=suspended", "page"),
        "runs page, search (a word no run holds)": ("/runs?q=zzzz", "page"),
        "run page, 1,000 events": (f"/runs/{long_run}", "page"),
        "audit page": ("/audit", "audit"),
        f"audit filtered (person={PEOPLE[7]})": (f"/audit?person={PEOPLE[7]}", "audit"),
        "audit filtered (tool, outcome)": ("/audit?tool=issue_refund&outcome=not_permitted", "audit"),
        "insights (30 days of decisions)": ("/insights?days=30", "page"),
        "deliveries page": ("/deliveries", "page"),
        "deliveries (status=failed)": ("/deliveries?status=failed", "page"),
        "deliveries, page 100": ("/deliveries?page=100", "page"),
        # The read-only Django admin, which the README offers admins for every table.
        "admin: audit entries": ("/admin/agents/auditentry/", "page"),
        "admin: audit entries (outcome, page 2)": ("/admin/agents/auditentry/?outcome=decided&p=2", "page"),
        f"admin: audit entries, search {PEOPLE[7]}": (f"/admin/agents/auditentry/?q={PEOPLE[7]}", "page"),
        "admin: approvals": ("/admin/agents/approval/", "page"),
        "admin: runs": ("/admin/agents/run/", "page"),
        "admin: tool calls": ("/admin/agents/toolcall/", "page"),
        "admin: deliveries": ("/admin/agents/delivery/", "page"),
    }


def _deep_cursor() -> str:
    """Return the cursor a client paging the pending approvals by `next_cursor` holds after DEEP rows."""
    from agents.models import Approval
    from dashboard.api.pages import cursor_for

    pending = Approval.objects.filter(status=Approval.Status.PENDING).order_by("-created_at", "-id")
    return cursor_for("approvals", pending[DEEP - 1])


def _time_page(client: Any, url: str, repeat: int) -> dict[str, Any]:
    from bench import measure

    samples = []
    for index in range(repeat + 3):
        gc.collect()
        t0 = time.perf_counter()
        response = client.get(url)
        body = response.content
        elapsed = measure.ms(time.perf_counter() - t0)
        if response.status_code != 200:
            raise setup.BenchError(f"GET {url}: {response.status_code} {body[:300]!r}")
        if index >= 3:
            samples.append(elapsed)
    return {**measure.summary(samples), "bytes": len(body)}


def _explain(client: Any, url: str) -> list[dict[str, Any]]:
    """Run the page once capturing its queries; EXPLAIN ANALYZE those on the agents_* tables."""
    return _explain_queries(lambda: client.get(url))


def _explain_queries(work: Any) -> list[dict[str, Any]]:
    """Do `work` once capturing its queries; EXPLAIN ANALYZE the reads of the agents_* tables."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        work()
    explained = []
    for query in captured.captured_queries:
        sql = query["sql"]
        if "agents_" not in sql or not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            continue
        prefix = "EXPLAIN ANALYZE " if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN "
        with connection.cursor() as cursor:
            cursor.execute(prefix + sql)
            plan = [" ".join(str(c) for c in row) for row in cursor.fetchall()]
        explained.append({"ms": float(query["time"]) * 1000.0, "sql": sql, "plan": plan})
    return explained


def _time_sweeper(repeat: int) -> dict[str, Any]:
    from agents import sweeper
    from bench import measure

    samples = []
    for index in range(repeat + 3):
        t0 = time.perf_counter()
        sweeper.sweep()
        if index >= 3:
            samples.append(measure.ms(time.perf_counter() - t0))
    return measure.summary(samples)


def _time_sweeper_reminding(repeat: int) -> dict[str, Any]:
    """Time a tick while every pending approval reminds daily (a tool's `remind_every`), reminded a moment ago.

    The sweeper must find the few due without reading them all; the approvals are set back after.
    """
    from django.utils import timezone

    from agents.models import Approval

    pending = Approval.objects.filter(status=Approval.Status.PENDING)
    pending.update(remind_every_seconds=86_400, last_reminded_at=timezone.now())
    _analyze()  # as autovacuum leaves a live table: not 100,000 dead rows of the update beside the live ones
    try:
        return _time_sweeper(repeat)
    finally:
        pending.update(remind_every_seconds=None, last_reminded_at=None)
        _analyze()


def _csv_export(client: Any) -> dict[str, Any]:
    """Stream /audit.csv from a real daphne (the async iterator is only streamed under ASGI)."""
    import httpx
    from django.conf import settings

    server = setup.start_daphne(setup.VAR_DIR / "scale-daphne.log")
    try:
        pid = server.process.pid
        rss_before = _proc_kb(pid, "VmRSS")
        cpu_before = _proc_cpu_seconds(pid)
        db_before = _postgres_cpu_seconds()
        cookies = {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}
        with httpx.Client(base_url=server.url, cookies=cookies, timeout=600) as http:
            t0 = time.perf_counter()
            first = None
            lines = 0
            size = 0
            with http.stream("GET", "/audit.csv") as response:
                if response.status_code != 200:
                    raise setup.BenchError(f"GET /audit.csv: {response.status_code}")
                for chunk in response.iter_bytes():
                    if first is None:
                        first = time.perf_counter() - t0
                    lines += chunk.count(b"\n")
                    size += len(chunk)
            seconds = time.perf_counter() - t0
        peak = _proc_kb(pid, "VmHWM")
        cpu = _proc_cpu_seconds(pid) - cpu_before
        db_cpu = _postgres_cpu_seconds() - db_before
    finally:
        server.stop()
    rows = lines - 1  # the header
    return {
        "rows": rows,
        "bytes": size,
        "seconds": seconds,
        "rows_per_s": rows / seconds if seconds else float("nan"),
        "first_byte_s": first,
        "cpu_seconds": cpu,
        "rows_per_cpu_s": rows / cpu if cpu else float("nan"),
        "db_cpu_seconds": db_cpu,
        "rows_per_total_cpu_s": rows / (cpu + db_cpu) if cpu + db_cpu else float("nan"),
        "rss_before_mb": rss_before / 1024,
        "peak_rss_mb": peak / 1024,
    }


def _proc_cpu_seconds(pid: int) -> float:
    """Return the CPU time (user + system) a process has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _postgres_cpu_seconds() -> float:
    """Return the CPU time every PostgreSQL process of this machine has used so far (0: none is visible here).

    On PostgreSQL the export's lines are written by the database: its CPU is part of the export's cost.
    """
    import psutil

    total = 0.0
    for process in psutil.process_iter(["name", "cpu_times"]):
        times = process.info["cpu_times"]
        if process.info["name"] in ("postgres", "postmaster") and times is not None:
            total += times.user + times.system
    return total


def _proc_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


# -- the report ----------------------------------------------------------------------------------


def render(results: dict[str, Any]) -> str:
    meta, built = results["meta"], results["built"]
    out = [
        f"agentfast at scale · {meta['database']}",
        f"{meta['cpus']} CPUs, load average {meta['loadavg_1m']:.2f}; bench time {meta['seconds']:.1f} s",
        (
            f"kept (--reuse) {built['runs']:,} runs and {built['audit']:,} audit entries"
            if built.get("reused")
            else f"built {built['runs']:,} runs ({meta['args']['pending']:,} pending approvals, "
            f"{meta['args']['decided']:,} decided) "
            f"in {built['runs_seconds']:.1f} s, {built['audit']:,} audit entries in {built['audit_seconds']:.1f} s, "
            f"{meta['args']['deliveries']:,} deliveries in {built.get('deliveries_seconds', 0.0):.1f} s"
        ),
        "",
        f"{'PAGE (admin, Django test client)':<48}{'n':>5}{'p50 ms':>10}{'p95 ms':>10}{'target p95':>12}{'KB':>8}",
    ]
    for label, page in results["pages"].items():
        target = TARGETS[page["kind"]]
        out.append(
            f"{label:<48}{page['n']:>5}{page['p50_ms']:>10.1f}{page['p95_ms']:>10.1f}{f'≤ {target:.0f}':>12}"
            f"{page['bytes'] / 1024:>8.0f}"
        )
    for label, key in (("sweeper tick", "sweeper"), ("sweeper tick, every pending one reminding", "sweeper_reminding")):
        sweep = results[key]
        out.append(
            f"{label:<48}{sweep['n']:>5}{sweep['p50_ms']:>10.1f}{sweep['p95_ms']:>10.1f}"
            f"{'≤ {:.0f}'.format(TARGETS['sweeper']):>12}"
        )
    csv = results.get("csv")
    if csv:
        out += [
            "",
            f"CSV export of the audit through daphne: {csv['rows']:,} rows, {csv['bytes'] / 1e6:.1f} MB in {csv['seconds']:.1f} s",
            f"  rows/s             {csv['rows_per_s']:>12,.0f}   (target ≥ {TARGETS['csv_rows_per_s']:,.0f})",
            f"  rows/s of CPU      {csv['rows_per_cpu_s']:>12,.0f}   "
            f"(over daphne's {csv['cpu_seconds']:.1f} CPU s: one core's rate, however busy the machine)",
            f"  rows/s of all CPU  {csv['rows_per_total_cpu_s']:>12,.0f}   "
            f"(daphne's and this machine's PostgreSQL's {csv['db_cpu_seconds']:.1f} CPU s together)",
            f"  first byte         {csv['first_byte_s']:>12.3f} s (target < {TARGETS['first_byte_s']:.0f} s)",
            f"  daphne RSS         {csv['rss_before_mb']:>9.0f} MB before, peak {csv['peak_rss_mb']:.0f} MB (target: flat)",
        ]
    out += ["", "targets are issue 12's, printed for information; nothing here asserts them"]
    for label, queries in results["explain"].items():
        out += ["", f"EXPLAIN · {label} · {len(queries)} queries on agents_* tables"]
        for query in queries:
            out += [f"  -- {query['ms']:.1f} ms: {query['sql']}"]
            out += [f"     {line}" for line in query["plan"]]
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
