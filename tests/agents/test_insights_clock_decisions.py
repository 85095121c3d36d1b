"""Hunt (the record): a decision the clock made (a deadline, a schedule) is nobody's on Insights."""

from __future__ import annotations

import json
from datetime import timedelta

from django.utils import timezone

from agents import selectors
from agents.models import Approval
from agents.services.deadlines import approval_deadline_fire
from dashboard.web import insights
from tests.support.flows import pending, start

REFUND = "Refund order A1001 for 25.00 USD"
CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
tool_overrides:
  refund_request: {refund}
"""


def test_a_deadlines_approval_is_not_counted_as_a_persons(agent_config, alice):
    agent_config(CONFIG.format(refund=json.dumps({"risk": "high", "timeout": "1h", "on_timeout": "approve"})))
    [approval] = pending(start(REFUND))
    # Asked two hours ago, its one-hour deadline passed: the clock approves it, nobody read it.
    Approval.objects.filter(pk=approval.pk).update(
        created_at=timezone.now() - timedelta(hours=2), expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert approval_deadline_fire(approval_id=approval.pk) == "approved"
    assert Approval.objects.get(pk=approval.pk).decided_by == "deadline"

    since = timezone.now() - timedelta(days=30)
    summary = insights.summarize(insights.read_tallies(since), selectors.decision_wait_percentiles(since=since))

    assert summary.decisions == 1  # the decision counts, by tool and agent
    assert "deadline" not in summary.by_reviewer  # but no reviewer named "deadline" made it
    assert summary.latency_by_tool == {}  # nor did a person take two hours over it


def test_the_clocks_names_are_the_ones_insights_leaves_out():
    from agents.services import deadlines

    assert {deadlines.DEADLINE, deadlines.SCHEDULE} <= set(getattr(selectors, "CLOCK_DECIDERS", ()))
