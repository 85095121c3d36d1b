"""`python -m bench.deadline_accuracy`: how close to its deadline an approval's timeout fires.

A real `celery worker --pool=solo` (no beat: no sweeper) fires each deadline from the task
scheduled with `eta` when the approval was created. The flow is the bench's: agent "bench"
pauses on send_email, here with `timeout` set; nobody decides.

  lateness    the approval's decided_at (set by the firing) − its expires_at (the deadline)
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench import setup


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.deadline_accuracy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="paused runs whose deadline fires (default 50)")
    parser.add_argument("--timeout", type=float, default=2.0, help="each approval's timeout in seconds (default 2)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.timeout <= 0:
        parser.error("--runs must be at least 1 and --timeout positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return setup.run(_main, parse_args(argv))


def _main(args: argparse.Namespace) -> int:
    target = setup.prepare()
    config = setup.VAR_DIR / "bench.yaml"
    config.write_text(
        setup.CONFIG.replace(
            "send_email: {risk: high, hitl_mode: suspend}",
            f"send_email: {{risk: high, hitl_mode: suspend, timeout: {args.timeout}}}",
        )
    )
    setup.start_redis()
    results = _run(args, target)
    print(json.dumps(results, indent=2) if args.json else render(results))
    return 0


def _run(args: argparse.Namespace, target: setup.Target) -> dict[str, Any]:
    import django

    django.setup()
    from django.core.management import call_command

    from agents.models import Approval
    from bench import measure

    measure.progress(f"migrating a fresh {target.engine} database ({target.label})")
    call_command("migrate", verbosity=0, interactive=False)
    setup.start_worker(setup.VAR_DIR / "worker-deadlines.log")
    measure.progress(f"deadlines: {args.runs} pauses, each with a {args.timeout:g} s timeout")
    run_ids = [measure.paused_run() for _ in range(args.runs)]
    approvals = Approval.objects.filter(run_id__in=run_ids)
    if approvals.count() != args.runs or approvals.exclude(expires_at__isnull=False).exists():
        raise setup.BenchError("not every bench run paused with a deadline")
    give_up = time.monotonic() + args.timeout + 60
    while approvals.filter(status=Approval.Status.PENDING).exists():
        if time.monotonic() > give_up:
            raise setup.BenchError("some deadlines never fired (see var/bench/worker-deadlines.log)")
        time.sleep(0.1)
    fired = list(approvals.values_list("status", "decided_by", "expires_at", "decided_at"))
    if any((status, by) != (Approval.Status.EXPIRED, "system") for status, by, _, _ in fired):
        raise setup.BenchError("a deadline ended some other way than its on_timeout (reject)")
    lateness = [measure.ms((decided - due).total_seconds()) for _, _, due, decided in fired]
    return {
        "meta": {"database": target.engine, "runs": args.runs, "timeout_s": args.timeout, "sweeper": False},
        "lateness": measure.summary(lateness),
        "early": sum(1 for value in lateness if value < 0),
    }


def render(results: dict[str, Any]) -> str:
    meta, s = results["meta"], results["lateness"]
    return "\n".join(
        [
            f"deadline accuracy ({meta['database']}, {meta['runs']} deadlines of {meta['timeout_s']:g} s, eta tasks only)",
            f"  fired after the deadline   p50 {s['p50_ms']:7.1f} ms   p95 {s['p95_ms']:7.1f} ms   max {s['max_ms']:7.1f} ms",
            f"  fired before the deadline  {results['early']}",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
