"""A standing grant must stop deciding calls once the policy asks more than one approval for them.

An agent's own tool_overrides may raise a tool's quorum, and a file ask rule's own quorum must
not lower it (README, "Who decides"). A grant is "checked again each time it would apply,
against the policy of that moment".
"""

from __future__ import annotations

import os

from agents.models import Approval, Grant, Run
from tests.support.flows import pending, start

BEFORE = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
tool_overrides:
  refund_request:
    risk: high
    hitl_mode: suspend
    rules:
      - {name: large refunds, when: "args.amount_cents > 5000", action: ask, quorum: 1}
"""

# The agent now asks two approvals for every refund it proposes.
AFTER = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
    tool_overrides:
      refund_request: {risk: high, hitl_mode: suspend, quorum: 2}
tool_overrides:
  refund_request:
    risk: high
    hitl_mode: suspend
    rules:
      - {name: large refunds, when: "args.amount_cents > 5000", action: ask, quorum: 1}
"""

PROMPT = "Refund order A1004 for 75.00 USD"


def test_a_grant_does_not_decide_a_call_the_agent_now_asks_two_approvals_for(agent_config, client_for, alice, bob):
    path = agent_config(BEFORE)
    [first] = pending(start(PROMPT))
    assert first.quorum == 1
    response = client_for(alice).post(
        f"/approvals/{first.id}/decide",
        {"decision": "approved", "remember": "3600", "remember_scope": "tool", "expect_digest": first.digest},
    )
    assert response.status_code == 302, response.content[:500]
    assert Grant.objects.filter(created_by="alice", decision="approved").count() == 1

    path.write_text(AFTER)
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 5))  # the policy cache reads it again

    run = start(PROMPT)

    # Without the grant the call asks two approvals: one person's remembered approval is not enough.
    decided = list(Approval.objects.filter(run=run).values_list("tool", "status", "decided_by", "quorum"))
    assert not any(by.startswith("grant:") for _, _, by, _ in decided), decided
    [asked] = pending(run)
    assert asked.quorum == 2
    assert asked.status == Approval.Status.PENDING
    assert run.status == Run.Status.SUSPENDED
