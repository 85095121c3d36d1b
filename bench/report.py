"""Turning the passes into the printed table, or into JSON."""

from __future__ import annotations

from typing import Any

from bench.measure import PHASES, Counted, Floor, InProcess, Storage, ThroughCelery, summary

TARGETS = {
    "round_trip_p50_ms": 6.0,  # in process, on PostgreSQL
    "write_txns_per_pause": 1,
    "rows_per_paused_run": 6,
    "bytes_per_paused_run": 5 * 1024,
    "celery_decision_to_effect_p95_ms": 20.0,
}


def build(
    *,
    meta: dict[str, Any],
    local: InProcess,
    whatif: InProcess,
    floor: Floor,
    counted: Counted,
    stored: Storage,
    celery: ThroughCelery | None,
    effects: dict[str, int],
) -> dict[str, Any]:
    latency = {
        "pause": summary(local.pause),
        "resume": summary(local.resume),
        "resume_decide_call": summary(local.decide),
        "round_trip": summary(local.round_trip),
        "resume_to_completed": summary(local.completed),
        "whatif_no_push_pause": summary(whatif.pause),
        "whatif_no_push_resume": summary(whatif.resume),
        "whatif_no_push_round_trip": summary(whatif.round_trip),
        "floor_select": summary(floor.select),
        "floor_write_txn": summary(floor.write_txn),
    }
    if celery is not None:
        latency["celery_decision_to_effect_polled"] = summary(celery.visible)
        latency["celery_decision_to_effect_db_clock"] = summary(celery.db_clock)
        latency["celery_decide_call"] = summary(celery.decide_call)
    n = counted.runs
    phases = {}
    for phase in PHASES:
        stats = counted.phases[phase]
        phases[phase] = {
            "statements": {k: stats.statements[k] / n for k in ("select", "insert", "update", "delete", "other")},
            "write_txns": len(stats.write_txns) / n,
            "txns": len(stats.txns) / n,
            "db_ms": stats.db_seconds * 1000 / n,
            "commit_ms": stats.commit_seconds * 1000 / n,
            "push_ms": stats.push_seconds * 1000 / n,
            "pushes": stats.pushes / n,
            "enqueue_ms": stats.enqueue_seconds * 1000 / n,
            "wall_ms": stats.wall_seconds * 1000 / n,
            "rest_ms": (
                stats.wall_seconds
                - stats.db_seconds
                - stats.commit_seconds
                - stats.push_seconds
                - stats.enqueue_seconds
            )
            * 1000
            / n,
            "sample_txns": counted.sample.get(phase, []),
        }
    rows = sum(stored.rows.values())
    size = sum(stored.bytes.values())
    pause_txns = phases["pause"]["write_txns"]
    to_suspended = phases["create"]["write_txns"] + pause_txns
    verdicts = {
        "round_trip_p50_ms": latency["round_trip"]["p50_ms"] <= TARGETS["round_trip_p50_ms"],
        "write_txns_per_pause": pause_txns <= TARGETS["write_txns_per_pause"],
        "rows_per_paused_run": rows <= TARGETS["rows_per_paused_run"],
        "bytes_per_paused_run": size <= TARGETS["bytes_per_paused_run"],
    }
    if celery is not None:
        verdicts["celery_decision_to_effect_p95_ms"] = (
            latency["celery_decision_to_effect_polled"]["p95_ms"] <= TARGETS["celery_decision_to_effect_p95_ms"]
        )
    return {
        "meta": meta,
        "latency": latency,
        "storage": {
            "paused_runs": stored.runs,
            "rows": stored.rows,
            "bytes": stored.bytes,
            "rows_total": rows,
            "bytes_total": size,
            "growth_per_run": stored.growth,
            "completed_run_rows": stored.completed_rows,
            "completed_run_bytes": stored.completed_bytes,
            "unattributed_tables": stored.unattributed,
        },
        "transactions": {
            "instrumented_runs": n,
            "write_txns_create_to_suspended": to_suspended,
            "write_txns_pause_step": pause_txns,
            "phases": phases,
        },
        "celery_poll_interval_ms": celery.poll_interval_ms if celery else None,
        "exactly_once": effects,
        "targets": TARGETS,
        "verdicts": verdicts,
    }


def _short(table: str) -> str:
    return table.removeprefix("agents_")


def render(data: dict[str, Any]) -> str:
    meta, lat, st, tx = data["meta"], data["latency"], data["storage"], data["transactions"]
    out: list[str] = []
    add = out.append
    add(f"agentfast bench · {meta['engine_version']} · {meta['database']} · DEBUG off")
    add(f"flow: {meta['flow']}")
    add(
        f"runs: {meta['runs']} in process (+{meta['warmup']} warm-up), "
        f"{meta['celery_runs'] or 0} through Celery (+{meta['celery_warmup']} warm-up); "
        f"bench time {meta['seconds']:.1f} s; load average {meta['loadavg_1m']:.2f} on {meta['cpus']} CPUs"
    )
    add("")
    add(f"{'LATENCY':<64}{'n':>5}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}")
    lines = [
        ("pause", "pause       run_create → run suspended & committed (in process)"),
        ("resume", "resume      decision → SideEffect committed (in process)"),
        ("resume_decide_call", "              of which approval_decide(auto_resume=False)"),
        ("round_trip", "round trip  pause + resume of one run (in process)"),
        ("resume_to_completed", "            decision → run completed (drive() returned)"),
        ("whatif_no_push_pause", "what-if     pause, Channels push stubbed out (bench-only no-op)"),
        ("whatif_no_push_resume", "            resume, Channels push stubbed out"),
        ("whatif_no_push_round_trip", "            round trip, Channels push stubbed out"),
        ("floor_select", "db floor    SELECT 1 (a statement's round trip through Django)"),
        ("floor_write_txn", "            atomic(): one INSERT + COMMIT (a write transaction)"),
        ("celery_decision_to_effect_polled", "celery      decision → SideEffect row seen (polled every {poll} ms)"),
        ("celery_decision_to_effect_db_clock", "            Approval.decided_at → SideEffect.created_at"),
        ("celery_decide_call", "            approval_decide() call incl. enqueue on commit"),
    ]
    for key, label in lines:
        if key not in lat:
            continue
        s = lat[key]
        label = label.format(poll=f"{data['celery_poll_interval_ms']:g}" if data["celery_poll_interval_ms"] else "")
        add(f"{label:<64}{s['n']:>5}{s['p50_ms']:>9.2f}{s['p95_ms']:>9.2f}{s['max_ms']:>9.2f}")
    add("  (what-if: agents.events._send replaced by a no-op in this process — how much the push after commit")
    add("   costs, all knock-on effects included; not a figure of the engine as it is.)")
    if "celery_decision_to_effect_polled" in lat:
        add("  (celery: decided_at and created_at are the app's timezone.now() stored in the rows, one machine clock:")
        add("   decided_at is set in the decision's UPDATE before its commit; created_at at the INSERT;")
        add("   the target is judged on the polled figure, the end-to-end one seen by a client.)")
    add("")
    bytes_how = (
        "sum(pg_column_size(t.*))"
        if meta["engine"] == "postgresql"
        else "SQLite record size: header + encoded values, from typeof()/length() of each column"
    )
    add(f"PER PAUSED RUN (mean of {st['paused_runs']} paused runs; bytes = {bytes_how})")
    add(f"  {'table':<20}{'rows':>7}{'bytes':>9}   {'a completed run:':<25}{'rows':>5}{'bytes':>9}")
    for table in st["rows"]:
        add(
            f"  {_short(table):<20}{st['rows'][table]:>7.1f}{st['bytes'][table]:>9.0f}   "
            f"{'':<25}{st['completed_run_rows'].get(table, 0):>5}{st['completed_run_bytes'].get(table, 0):>9}"
        )
    add(
        f"  {'total':<20}{st['rows_total']:>7.1f}{st['bytes_total']:>9.0f}   "
        f"{'':<25}{sum(st['completed_run_rows'].values()):>5}{sum(st['completed_run_bytes'].values()):>9}"
    )
    growth = st["growth_per_run"]
    if "total_relation_bytes" in growth:
        add(
            f"  growth incl. indexes & TOAST: ≈ {growth['total_relation_bytes']:.0f} B/run "
            f"(pg_total_relation_size of agents_* tables, 8 KB pages, over {st['paused_runs']} runs)"
        )
    if "payload_bytes" in growth:
        add(
            f"  growth incl. indexes: {growth['payload_bytes']:.0f} B/run of cell payload, "
            f"≈ {growth['page_bytes']:.0f} B/run of pages (dbstat of agents_* tables and indexes)"
        )
    if st["unattributed_tables"]:
        add(f"  (tables with no per-run column, not counted: {', '.join(st['unattributed_tables'])})")
    add("")
    n = tx["instrumented_runs"]
    add(f"QUERIES & TRANSACTIONS PER PHASE (mean of {n} runs under an execute_wrapper; wall includes its overhead)")
    add(
        f"  {'phase':<8}{'SELECT':>7}{'INSERT':>7}{'UPDATE':>7}{'DELETE':>7}{'other':>6}"
        f"{'txns':>6}{'write':>6}{'db ms':>8}{'commit':>7}{'push ms':>9}{'pushes':>7}{'rest ms':>8}{'wall ms':>9}"
    )
    for phase, p in tx["phases"].items():
        s = p["statements"]
        add(
            f"  {phase:<8}{s['select']:>7.1f}{s['insert']:>7.1f}{s['update']:>7.1f}{s['delete']:>7.1f}{s['other']:>6.1f}"
            f"{p['txns']:>6.1f}{p['write_txns']:>6.1f}{p['db_ms']:>8.2f}{p['commit_ms']:>7.2f}{p['push_ms']:>9.2f}{p['pushes']:>7.1f}{p['rest_ms']:>8.2f}{p['wall_ms']:>9.2f}"
        )
    add("  create = run_create; pause = drive() until suspended; decide = approval_decide(auto_resume=False);")
    add("  resume = drive() to completion. other = BEGIN/SAVEPOINT; db = statements; commit = COMMIT of atomic")
    add("  blocks (autocommit statements commit inside db); push = time the caller spends in agents.events._send")
    add("  after commit (the Channels group_send, or handing it to a background sender);")
    add("  rest = wall − db − commit − push: Python (ORM, driver, model, tool, lease-keeper thread).")
    add(
        f"  write transactions run_create → suspended: {tx['write_txns_create_to_suspended']:g} "
        f"(run_create {tx['phases']['create']['write_txns']:g} + pause step {tx['write_txns_pause_step']:g})"
    )
    add("  committed transactions of one run:")
    for phase, p in tx["phases"].items():
        for i, txn in enumerate(p["sample_txns"], start=1):
            add(f"    {phase if i == 1 else '':<8}{i}. {txn}")
    add("")
    eo = data["exactly_once"]
    add(f"EXACTLY ONCE: {eo['side_effects']} SideEffect rows for {eo['approved']} approved calls")
    add("")
    add(f"{'TARGETS':<48}{'target':>14}{'measured':>14}")
    t, v = data["targets"], data["verdicts"]
    rows = [
        (
            "round_trip_p50_ms",
            "pause + resume round trip in process, p50",
            f"≤ {t['round_trip_p50_ms']:g} ms (PG)",
            f"{lat['round_trip']['p50_ms']:.2f} ms",
        ),
        (
            "write_txns_per_pause",
            "write transactions per pause (pause step)",
            f"{t['write_txns_per_pause']}",
            f"{tx['write_txns_pause_step']:g}",
        ),
        ("rows_per_paused_run", "rows per paused run", f"≤ {t['rows_per_paused_run']}", f"{st['rows_total']:g}"),
        (
            "bytes_per_paused_run",
            "bytes per paused run (rows)",
            f"≤ {t['bytes_per_paused_run'] / 1024:g} KB",
            f"{st['bytes_total'] / 1024:.2f} KB",
        ),
    ]
    if "celery_decision_to_effect_p95_ms" in v:
        rows.append(
            (
                "celery_decision_to_effect_p95_ms",
                "decision → side effect via Celery, p95 (polled)",
                f"≤ {t['celery_decision_to_effect_p95_ms']:g} ms",
                f"{lat['celery_decision_to_effect_polled']['p95_ms']:.2f} ms",
            )
        )
    for key, label, target, measured in rows:
        add(f"{label:<48}{target:>14}{measured:>14}   {'ok' if v[key] else 'MISSED'}")
    if meta["engine"] != "postgresql":
        add("(the latency targets are set for PostgreSQL; on SQLite they are for comparison only)")
    return "\n".join(out)
