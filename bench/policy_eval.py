"""`python -m bench.policy_eval`: what the policy's evaluation adds to a pause, per proposed call.

Times `agents.policy.rules.evaluate` on the shipped agentfast.yaml (refund_request: three
CEL rules) for each outcome, and on an unlisted tool, and prints p50/p95 in microseconds.
"""

from __future__ import annotations

import os
import statistics
import time

N = 2000


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    import django

    django.setup()
    from django.conf import settings

    from agents.policy import load
    from agents.policy.rules import CallFacts, evaluate

    policy = load(settings.AGENTFAST_CONFIG)
    agent = policy.agent("support")
    run = {"id": "run_x", "agent": "support", "created_by": "alice", "input": "Refund"}
    cases = {
        "allow (small refunds)": ("refund_request", {"order_id": "A1001", "amount_cents": 500}),
        "ask, no rule matches": ("refund_request", {"order_id": "A1001", "amount_cents": 2500}),
        "ask (large refunds)": ("refund_request", {"order_id": "A1004", "amount_cents": 7500}),
        "deny (huge refunds)": ("refund_request", {"order_id": "A1010", "amount_cents": 150000}),
        "unlisted tool": ("lookup_order", {"order_id": "A1001"}),
    }
    print(f"policy evaluation per proposed call, {N} calls each ({settings.AGENTFAST_CONFIG.name})")
    print(f"{'case':32} {'p50 µs':>8} {'p95 µs':>8}")
    for label, (tool, args) in cases.items():
        facts = CallFacts(tool=tool, args=args, agent="support", run=run)
        samples = []
        for _ in range(N):
            start = time.perf_counter()
            evaluate(policy, facts, agent=agent)
            samples.append((time.perf_counter() - start) * 1e6)
        samples.sort()
        print(f"{label:32} {statistics.median(samples):8.1f} {samples[int(len(samples) * 0.95)]:8.1f}")


if __name__ == "__main__":
    main()
