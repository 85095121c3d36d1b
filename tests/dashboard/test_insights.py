"""Insights: the figures for a known set of decisions, and the page that draws them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from dashboard import insights
from dashboard.insights import Decided, percentile, queue_depth, summarize
from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, start

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def decided(
    seconds: float, *, tool: str = "refund_request", reviewer: str = "alice", outcome: str = "approved"
) -> Decided:
    return Decided(tool, "support", reviewer, outcome, T0, T0 + timedelta(seconds=seconds))


def cells(html: str, by: str, name: str) -> tuple[str, ...]:
    table = html[html.index(f'data-by="{by}"') :]
    row = re.search(rf'<tr data-name="{re.escape(name)}">(.*?)</tr>', table).group(1)
    return tuple(re.findall(r"<td[^>]*>([^<]*)</td>", row))


def test_it_takes_nearest_rank_percentiles():
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 100.0]

    assert (percentile(values, 0.5), percentile(values, 0.95)) == (5.0, 100.0)
    assert percentile([7.0], 0.95) == 7.0


def test_it_computes_latency_rates_and_rubber_stamps_from_known_decisions():
    rows = [
        decided(1.0),
        decided(1.5, reviewer="bob"),
        decided(30.0, outcome="edited"),
        decided(600.0, reviewer="bob", outcome="rejected"),
        decided(0.0, reviewer=""),  # a rule decided it: counts in the rates only
        decided(4.0, tool="send_email", reviewer="bob"),
    ]

    summary = summarize(rows)

    assert summary.decisions == 6
    assert summary.latency_by_tool == {"refund_request": (1.5, 600.0), "send_email": (4.0, 4.0)}
    by_tool = summary.by_tool["refund_request"]
    assert (by_tool.approved, by_tool.edited, by_tool.rejected) == (3, 1, 1)
    bob = summary.by_reviewer["bob"]
    assert (bob.approved, bob.edited, bob.rejected) == (2, 0, 1)
    assert "" not in summary.by_reviewer
    assert summary.rubber_stamped == {"alice": 1, "bob": 1}
    assert summary.suggestions == []


def test_it_suggests_a_rule_for_a_tool_always_approved_as_asked():
    always = [decided(5.0, tool="lookup_order") for _ in range(insights.RULE_SUGGESTION_MIN)]
    once_edited = [decided(5.0, tool="send_email") for _ in range(insights.RULE_SUGGESTION_MIN)]
    once_edited.append(decided(5.0, tool="send_email", outcome="edited"))

    summary = summarize(always + once_edited + always[:1])

    assert summary.suggestions == [("lookup_order", insights.RULE_SUGGESTION_MIN + 1)]


def test_it_counts_the_most_approvals_open_at_once_in_each_period():
    spans = [
        (T0 - timedelta(hours=1), T0 + timedelta(seconds=1)),  # open before the window, decided in its first period
        (T0, T0 + timedelta(seconds=1)),  # decided in a second: still counted in its period
        (T0 + timedelta(hours=3), None),  # still waiting
    ]

    depth = queue_depth(spans, start=T0, end=T0 + timedelta(hours=insights.DEPTH_POINTS))

    assert [count for _, count in depth[:5]] == [2, 0, 0, 1, 1]
    assert depth[-1][1] == 1 and len(depth) == insights.DEPTH_POINTS


def test_it_shows_the_rates_of_decisions_made_through_the_services(client_for, alice, monkeypatch):
    monkeypatch.setattr(insights, "RULE_SUGGESTION_MIN", 2)
    first, second, third = (pending(start(REFUND))[0] for _ in range(3))
    decide(first, "approved", by="alice")
    decide(second, "approved", by="alice", arguments={"order_id": "A1001", "amount_cents": 2000})
    decide(third, "rejected", by="bob", note="no")
    start("Refund order A1002 for 5.00 USD")  # allowed by the rule "small refunds": nobody decides
    start("Email bob@example.com that his refund is on its way")  # send_email waits (deferred)

    response = client_for(alice).get("/insights")

    html = response.content.decode()
    assert response.status_code == 200
    assert '<strong id="decision-count">4</strong>' in html
    assert cells(html, "by-tool", "refund_request") == ("refund_request", "2", "1", "1", "4")
    assert cells(html, "by-agent", "support") == ("support", "2", "1", "1", "4")
    assert cells(html, "by-reviewer", "alice") == ("alice", "1", "1", "0", "2")
    assert cells(html, "by-reviewer", "bob") == ("bob", "0", "0", "1", "1")
    assert 'data-tool="refund_request"' in html and "<svg" in html
    assert '<p class="big-number" data-depth-now>1</p>' in html
    assert "Make it a rule?" not in html  # refund_request was edited and rejected too


def test_it_shows_insights_to_reviewers_only(client_for, alice, dave):
    assert client_for(dave).get("/insights").status_code == 403
    assert client_for(alice).get("/insights?days=7").status_code == 200


def test_it_counts_one_decision_in_the_singular(client_for, alice):
    decide(pending(start(REFUND))[0], "approved", by="alice")

    html = client_for(alice).get("/insights").content.decode()

    assert '<strong id="decision-count">1</strong> decision.' in html
