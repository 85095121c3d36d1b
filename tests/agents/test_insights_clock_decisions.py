"""A decision the clock made (a deadline, a schedule) is nobody's on Insights."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from agents import selectors
from agents.models import Approval
from agents.services.deadlines import approval_deadline_fire
from dashboard.web import insights
from tests.support.flows import pending, start
from tests.support.policies import support_yaml

REFUND = "Refund order A1001 for 25.00 USD"


def test_a_deadlines_approval_is_not_counted_as_a_persons(agent_config, alice):
    agent_config(support_yaml(timeout="1h", on_timeout="approve"))
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
