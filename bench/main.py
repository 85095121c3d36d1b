"""`python -m bench`: set up, run the passes, print the figures, clean up."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from bench import setup


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Pause/resume latency and storage per paused run of agentfast, on a fresh bench "
        "database (SQLite in var/bench/, or DATABASE_URL=postgres://…/<name containing 'bench'>).",
    )
    parser.add_argument("--runs", type=int, default=200, help="timed runs in process (default 200)")
    parser.add_argument(
        "--celery-runs", type=int, default=None, help="timed decisions through a Celery worker (default: --runs / 2)"
    )
    parser.add_argument("--no-celery", action="store_true", help="skip the pass through a Celery worker")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of 50 in-process round trips")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.celery_runs is None:
        args.celery_runs = max(1, args.runs // 2)
    if args.celery_runs < 1:
        parser.error("--celery-runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return setup.run(_main, parse_args(argv), time.perf_counter())


def _main(args: argparse.Namespace, started: float) -> int:
    target = setup.prepare()
    setup.start_redis()
    try:
        data, profile_text = _run(args, target, started)
    finally:
        setup.stop_workers()
        _flush_events()  # while Redis still answers
        _close_connections()
    if args.json:
        print(json.dumps(_finite(data), indent=2, default=str))
    else:
        print(_render(data))
        if profile_text:
            print("\nPROFILE (cProfile of 50 in-process round trips)\n" + profile_text)
    return 0


def _run(args: argparse.Namespace, target: setup.Target, started: float) -> tuple[dict[str, Any], str]:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from bench import measure, report

    progress = measure.progress
    progress(f"migrating a fresh {target.engine} database ({target.label})")
    call_command("migrate", verbosity=0, interactive=False)
    warmup, celery_warmup = 10, 5
    measure.check_flow()
    progress("the database's floor: SELECT 1 and a one-INSERT transaction")
    floor = measure.floor(200)
    progress(f"in process: {args.runs} runs (+{warmup} warm-up)")
    local = measure.in_process(args.runs, warmup)
    whatif_runs = max(1, args.runs // 2)
    progress(f"what-if: {whatif_runs} runs in process with the Channels push stubbed out")
    with measure.pushes_stubbed():
        whatif = measure.in_process(whatif_runs, 5)
    counted_runs = min(20, args.runs)
    progress(f"counting queries and transactions over {counted_runs} runs")
    counted = measure.instrumented(counted_runs)
    stored_runs = min(50, args.runs)
    progress(f"storage of {stored_runs} paused runs")
    stored = measure.storage_pass(stored_runs, local.last_run_id)
    celery = None
    if not args.no_celery:
        progress(f"through Celery: starting a worker, then {args.celery_runs} decisions (+{celery_warmup} warm-up)")
        celery = measure.through_celery(args.celery_runs, celery_warmup)
    profile_text = ""
    if args.profile:
        progress("profiling 50 round trips")
        profile_text = measure.profile(50)
    # The paused runs of the storage pass were never decided; every approved one ran once.
    effects = measure.effects_check()
    meta = {
        "engine": target.engine,
        "engine_version": _engine_version(connection),
        "database": target.label,
        "flow": (
            f'agent "{setup.AGENT}" (model demo, tools [send_email]; send_email: risk high, hitl_mode suspend); '
            f'prompt "{setup.PROMPT}" → pauses on send_email → approved → one SideEffect'
        ),
        "runs": args.runs,
        "warmup": warmup,
        "celery_runs": None if args.no_celery else args.celery_runs,
        "celery_warmup": 0 if args.no_celery else celery_warmup,
        "config": str(setup.VAR_DIR / "bench.yaml"),
    }
    meta["seconds"] = time.perf_counter() - started
    meta["cpus"] = os.cpu_count()
    meta["loadavg_1m"] = os.getloadavg()[0]
    data = report.build(
        meta=meta,
        local=local,
        whatif=whatif,
        floor=floor,
        counted=counted,
        stored=stored,
        celery=celery,
        effects=effects,
    )
    return data, profile_text


def _engine_version(connection: Any) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            return f"PostgreSQL {cursor.fetchone()[0].split()[0]}"
        cursor.execute("SELECT sqlite_version()")
        version = cursor.fetchone()[0]
        cursor.execute("PRAGMA journal_mode")
        journal = cursor.fetchone()[0]
        cursor.execute("PRAGMA synchronous")
        sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(cursor.fetchone()[0], "?")
        return f"SQLite {version} (journal {journal}, synchronous {sync})"


def _render(data: dict[str, Any]) -> str:
    from bench import report

    return report.render(data)


def _flush_events() -> None:
    # An engine that pushes events from a background thread: let it drain while Redis is up.
    events = sys.modules.get("agents.events")
    flush = getattr(events, "flush", None)
    if callable(flush):
        try:
            flush(5.0)
        except Exception:  # noqa: BLE001 — best effort at exit
            pass


def _close_connections() -> None:
    if "django.db" in sys.modules:
        from django.db import connections

        try:
            connections.close_all()
        except Exception:  # noqa: BLE001 — best effort at exit
            pass


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
