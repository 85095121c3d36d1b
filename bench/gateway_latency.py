"""`python -m bench.gateway_latency`: the external-agent gate over HTTP, timed.

One daphne process serves the API on the bench's fresh database and private Redis
(bench.setup); no worker is needed (an external agent runs its own tools). An agent
token gates `wire_money` (a tool no module registers, asked by agentfast.yaml):

  gate → pending        POST /api/gate, a new call each time, until the `pending` answer is read
  decision → woken      a client waits on GET /api/approvals/{id}/wait?timeout=60; this
                        process decides (approval_decide, as the API's decide does); from the
                        call to the service to the waiting client reading its answer
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

import httpx

from bench import setup

CONFIG = """\
# Written by `python -m bench.gateway_latency`; overwritten on every run.
agents: {}
tool_overrides:
  wire_money: {risk: high}
"""
SETTLE = 0.05  # let the waiting request reach its view and subscribe before deciding


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="timed gates and decisions (default 100)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return setup.run(_main, parse_args(argv))


def _main(args: argparse.Namespace) -> int:
    target = setup.prepare()
    config = setup.VAR_DIR / "gateway.yaml"
    config.write_text(CONFIG)
    os.environ["AGENTFAST_CONFIG"] = str(config)
    setup.start_redis()
    with setup.django_migrated(target):
        results = _run(args, target)
    print(json.dumps(results, indent=2) if args.json else render(results))
    return 0


def _run(args: argparse.Namespace, target: setup.Target) -> dict[str, Any]:
    from agents import services
    from bench import measure

    started = time.perf_counter()
    services.user_create(username="bench-agent", role="agent")
    services.user_create(username="bench-reviewer", role="reviewer")
    token = services.token_create(username="bench-agent")[1]
    daphne = setup.start_daphne(setup.VAR_DIR / "daphne.log")
    try:
        with httpx.Client(base_url=daphne.url, headers={"Authorization": f"Bearer {token}"}, timeout=90) as client:
            warmup = min(10, args.runs)
            measure.progress(f"gate → pending: {args.runs} calls (+{warmup} warm-up)")
            gated = gate_to_pending(client, args.runs, warmup)
            measure.progress(f"decision → waiting client woken: {args.runs} decisions (+{warmup} warm-up)")
            woken = decision_to_woken(client, args.runs, warmup)
    finally:
        daphne.stop()
    return {
        "meta": _meta(target, args, time.perf_counter() - started),
        "gate_to_pending": measure.summary(gated),
        "decision_to_woken": measure.summary(woken),
    }


def _gate(client: httpx.Client, call_id: str) -> str:
    body = {"agent": "bench", "session": "s1", "call_id": call_id, "tool": "wire_money", "arguments": {"cents": 1}}
    response = client.post("/api/gate", json=body)
    answer = response.json() if response.status_code == 200 else {}
    _expect(answer.get("decision") == "pending", f"gate {call_id}: {response.status_code} {response.text}")
    return answer["approval_id"]


def gate_to_pending(client: httpx.Client, runs: int, warmup: int) -> list[float]:
    """Gate new calls one at a time; time each request until its `pending` answer is read."""
    from bench import measure

    samples = []
    for index in range(warmup + runs):
        t0 = time.perf_counter()
        _gate(client, f"gate-{index}")
        if index >= warmup:
            samples.append(measure.ms(time.perf_counter() - t0))
    return samples


def decision_to_woken(client: httpx.Client, runs: int, warmup: int) -> list[float]:
    """Decide a call while a client waits on it; time from the decision to the client's answer."""
    from agents import services
    from agents.models import AuditEntry
    from bench import measure

    attempt = services.Attempt(actor="bench-reviewer", source=AuditEntry.Source.API)
    samples = []
    for index in range(warmup + runs):
        approval_id = _gate(client, f"wait-{index}")
        answered: list[float] = []
        statuses: list[str] = []

        def wait(
            approval_id: str = approval_id, answered: list[float] = answered, statuses: list[str] = statuses
        ) -> None:
            response = client.get(f"/api/approvals/{approval_id}/wait", params={"timeout": 60})
            answered.append(time.perf_counter())
            statuses.append(response.json().get("status", response.text))

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(SETTLE)
        t0 = time.perf_counter()
        services.approval_decide(approval_id=approval_id, decision="approved", attempt=attempt)
        waiter.join(timeout=90)
        _expect(statuses == ["approved"], f"wait {approval_id}: {statuses}")
        if index >= warmup:
            samples.append(measure.ms(answered[0] - t0))
    return samples


def _expect(condition: bool, problem: str) -> None:
    if not condition:
        raise setup.BenchError(problem)


def _meta(target: setup.Target, args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    return {
        "database": f"{target.engine} ({target.label})",
        "processes": "1 daphne web process, this process gating (HTTP) and deciding",
        "runs": args.runs,
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "seconds": seconds,
    }


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    rows = [
        ("gate → pending answer (HTTP)", results["gate_to_pending"]),
        ("decision → waiting client woken", results["decision_to_woken"]),
    ]
    out = [
        f"agentfast gate bench · {meta['database']} · {meta['processes']}",
        f"{meta['cpus']} CPUs, load average {meta['loadavg_1m']:.2f}; bench time {meta['seconds']:.1f} s",
        "",
        f"{'LATENCY':<40}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}",
    ]
    out += [f"{label:<40}{s['n']:>6}{s['p50_ms']:>10.2f}{s['p95_ms']:>10.2f}{s['max_ms']:>10.2f}" for label, s in rows]
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
