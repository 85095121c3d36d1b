"""`python -m bench.notify_latency`: how long a webhook takes from the event to the receiver.

A real `celery worker --pool=solo` delivers; a local HTTP receiver in this process checks
every Standard Webhooks signature and notes when each event arrived. The flow is the
bench's: agent "bench" pauses on send_email; this process decides it.

  pause → receiver     approval.required: the approval's created_at (its INSERT, just
                       before the pause commits) → the signed POST read by the receiver
  decide → receiver    approval.decided: just before approval_decide here → the POST read
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import threading
import time
from typing import Any

from bench import setup
from tests.support.receiver import Receiver

SECRET = "whsec_" + base64.b64encode(b"bench secret, thirty-two bytes!!").decode()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.notify_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="timed pauses and decisions (default 50)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return setup.run(_main, parse_args(argv))


def _main(args: argparse.Namespace) -> int:
    receiver = TimedReceiver(secret=SECRET)
    target = setup.prepare()
    config = setup.VAR_DIR / "bench.yaml"
    config.write_text(
        setup.CONFIG
        + f"notifications:\n  - kind: webhook\n    url: {receiver.url}\n    secret_env: BENCH_WEBHOOK_SECRET\n"
    )
    os.environ["BENCH_WEBHOOK_SECRET"] = SECRET
    setup.start_redis()
    receiver.start()
    try:
        results = _run(args, target, receiver)
    finally:
        setup.stop_workers()  # before the receiver they post to
        receiver.stop()
    print(json.dumps(results, indent=2) if args.json else render(results))
    return 0


class TimedReceiver(Receiver):
    """The tests' receiver, noting when (wall clock and monotonic) each event arrived."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arrived: dict[tuple[str, str], tuple[float, float]] = {}
        self.changed = threading.Condition()

    def _verify(self, raw: bytes, headers: dict[str, str]) -> bool:
        verified = super()._verify(raw, headers)
        body = json.loads(raw)
        with self.changed:
            self.arrived[(body["type"], body["data"]["approval_id"])] = (time.time(), time.perf_counter())
            self.changed.notify_all()
        return verified

    def wait(self, key: tuple[str, str], timeout: float = 30) -> tuple[float, float]:
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.arrived, timeout=timeout):
                raise setup.BenchError(f"{key} never reached the receiver")
            return self.arrived[key]


def _run(args: argparse.Namespace, target: setup.Target, receiver: TimedReceiver) -> dict[str, Any]:
    import django

    django.setup()
    from django.core.management import call_command

    from agents import ids, services
    from agents.models import Approval
    from bench import measure

    measure.progress(f"migrating a fresh {target.engine} database ({target.label})")
    call_command("migrate", verbosity=0, interactive=False)
    setup.start_worker(setup.VAR_DIR / "worker-notify.log")
    warmup = min(5, args.runs)
    pauses, decisions = [], []
    measure.progress(f"webhooks: {args.runs} pauses and decisions (+{warmup} warm-up)")
    for index in range(warmup + args.runs):
        run_id = measure.paused_run()
        approval = Approval.objects.get(pk=ids.approval_id(run_id, measure.CALL_ID))
        arrived_wall, _ = receiver.wait(("approval.required", approval.id))
        started = time.perf_counter()
        services.approval_decide(
            approval_id=approval.id, decision="approved", attempt=measure.ATTEMPT, auto_resume=False
        )
        _, arrived = receiver.wait(("approval.decided", approval.id))
        if index >= warmup:
            pauses.append(measure.ms(arrived_wall - approval.created_at.timestamp()))
            decisions.append(measure.ms(arrived - started))
    if not all(item.verified for item in receiver.received):
        raise setup.BenchError("a webhook signature did not verify")
    return {
        "meta": {"database": target.engine, "runs": args.runs, "received": len(receiver.received)},
        "pause_to_receiver": measure.summary(pauses),
        "decide_to_receiver": measure.summary(decisions),
    }


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    title = f"webhook delivery latency ({meta['database']}, {meta['runs']} runs, {meta['received']} POSTs verified)"
    lines = [title]
    for name in ("pause_to_receiver", "decide_to_receiver"):
        s = results[name]
        lines.append(f"  {name:<20} p50 {s['p50_ms']:7.1f} ms   p95 {s['p95_ms']:7.1f} ms   max {s['max_ms']:7.1f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
