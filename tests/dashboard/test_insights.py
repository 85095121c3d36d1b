"""Insights: the figures for a known set of decisions, and the page that draws them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from xml.etree import ElementTree

import pytest
from django.utils import timezone

from agents import selectors
from agents.models import Approval
from agents.selectors import percentile
from dashboard.web import insights
from dashboard.web.insights import Tally, queue_depth, summarize
from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, start

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def asked(created_at: datetime, decided_at: datetime | None = None, **fields: object) -> Approval:
    """Return an approval of a real run, made to have been asked and decided at these times."""
    approval = pending(start(REFUND))[0]
    if decided_at is not None:
        fields = {"status": Approval.Status.APPROVED, "decided_by": "alice", **fields}
    Approval.objects.filter(pk=approval.pk).update(created_at=created_at, decided_at=decided_at, **fields)
    return approval


def decided(
    seconds: float, *, at: datetime, reviewer: str = "alice", outcome: str = "approved", **fields: object
) -> None:
    status = Approval.Status.REJECTED if outcome == "rejected" else Approval.Status.APPROVED
    edit = {"arguments": {"order_id": "A1001", "amount_cents": 100}} if outcome == "edited" else {}
    asked(at - timedelta(seconds=seconds), at, **{"decided_by": reviewer, "status": status, **edit, **fields})


def cells(html: str, by: str, name: str) -> tuple[str, ...]:
    table = html[html.index(f'data-by="{by}"') :]
    row = re.search(rf'<tr data-name="{re.escape(name)}">(.*?)</tr>', table).group(1)
    return tuple(re.findall(r"<td[^>]*>([^<]*)</td>", row))


def test_it_takes_nearest_rank_percentiles():
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 100.0]

    assert (percentile(values, 0.5), percentile(values, 0.95)) == (5.0, 100.0)
    assert percentile([7.0], 0.95) == 7.0


def test_it_reads_latency_rates_and_rubber_stamps_from_known_decisions(db):
    now = timezone.now()
    yesterday = now - timedelta(days=1)
    decided(1.0, at=now)
    decided(1.5, at=now, reviewer="bob")
    decided(1.9, at=yesterday, outcome="edited")  # quick, but edited: read, not stamped
    decided(30.0, at=yesterday)
    decided(600.0, at=now, reviewer="bob", outcome="rejected")
    decided(0.0, at=now, reviewer="policy:small refunds")  # a rule decided it: counts in the rates only
    decided(0.0, at=now, reviewer="grant:g-1")  # so did a standing grant
    decided(4.0, at=now, reviewer="bob", tool="send_email")
    decided(1.0, at=now - timedelta(days=40))  # before the window
    decided(1.0, at=now, status=Approval.Status.EXPIRED)  # nobody decided it
    asked(now - timedelta(seconds=5))  # still waiting

    since = now - timedelta(days=30)
    summary = summarize(insights.read_tallies(since), selectors.decision_wait_percentiles(since=since))

    assert summary.decisions == 8

    def to_the_microsecond(expected: tuple[float, float]) -> object:
        return pytest.approx(expected, abs=1e-6)  # seconds as floats, to the microsecond the times keep

    assert summary.latency_by_tool == {
        "refund_request": to_the_microsecond((1.9, 600.0)),
        "send_email": to_the_microsecond((4.0, 4.0)),
    }
    today, before = timezone.localdate(now), timezone.localdate(yesterday)
    series = summary.latency_series["refund_request"]
    assert [day for day, _, _ in series] == [before, today]
    assert [(p50, p95) for _, p50, p95 in series] == [to_the_microsecond((1.9, 30.0)), to_the_microsecond((1.5, 600.0))]
    by_tool = summary.by_tool["refund_request"]
    assert (by_tool.approved, by_tool.edited, by_tool.rejected) == (5, 1, 1)
    assert (summary.by_agent["support"].total, summary.by_tool["send_email"].total) == (8, 1)
    bob = summary.by_reviewer["bob"]
    assert (bob.approved, bob.edited, bob.rejected) == (2, 0, 1)
    assert set(summary.by_reviewer) == {"alice", "bob"}
    assert summary.rubber_stamped == {"alice": 1, "bob": 1}
    assert summary.suggestions == []


def test_it_takes_the_same_percentiles_on_every_database_where_the_rank_is_a_whole_number(db):
    # 0.95 x 20 is 19 in floating point, as 0.5 x 20 is 10: the 19th and 10th waits, not the next.
    now = timezone.now()
    yesterday = now - timedelta(days=1)
    for seconds in range(1, 21):
        decided(float(seconds), at=now if seconds % 3 else yesterday)

    found = selectors.decision_wait_percentiles(since=now - timedelta(days=30))

    today = [float(s) for s in range(1, 21) if s % 3]
    before = [float(s) for s in range(1, 21) if not s % 3]
    assert (len(today), len(before)) == (14, 6)
    expected = [
        ("refund_request", None, 10.0, 19.0),
        ("refund_request", timezone.localdate(yesterday), before[2], before[5]),
        ("refund_request", timezone.localdate(now), today[6], today[13]),
    ]
    ordered = sorted(found, key=lambda row: (row[1] is not None, row[1]))
    assert [
        (tool, day, pytest.approx(p50, abs=1e-6), pytest.approx(p95, abs=1e-6)) for tool, day, p50, p95 in ordered
    ] == expected


def test_it_suggests_a_rule_for_a_tool_always_approved_as_asked():
    always = Tally("lookup_order", "support", "alice", "approved", insights.RULE_SUGGESTION_MIN)
    often = Tally("send_email", "support", "alice", "approved", insights.RULE_SUGGESTION_MIN)
    once_edited = Tally("send_email", "support", "bob", "edited", 1)
    by_a_rule = Tally("lookup_order", "support", "", "approved", 1)

    summary = summarize([always, often, once_edited, by_a_rule], [])

    assert summary.suggestions == [("lookup_order", insights.RULE_SUGGESTION_MIN + 1)]


def test_it_counts_the_most_approvals_open_at_once_in_each_period(db):
    asked(T0 - timedelta(hours=1), T0 + timedelta(seconds=1))  # open before the window, decided in its first period
    asked(T0, T0 + timedelta(seconds=1))  # decided in a second: still counted in its period
    asked(T0 + timedelta(hours=3))  # still waiting
    asked(T0 - timedelta(hours=2), T0 - timedelta(hours=1))  # decided before the window: never counted
    asked(T0 + timedelta(hours=10, seconds=1), T0 + timedelta(hours=10, seconds=2))
    asked(T0 + timedelta(hours=10, seconds=2), T0 + timedelta(hours=10, seconds=3))  # asked as the one before ends
    end = T0 + timedelta(hours=insights.DEPTH_POINTS)

    periods = selectors.approvals_open_by_period(start=T0, seconds=3600)
    depth = queue_depth(periods, start=T0, end=end)

    assert [count for _, count in depth[:5]] == [2, 0, 0, 1, 1]
    assert depth[10][1] == 2  # a decision is taken before a call asked at the same moment
    assert depth[-1][1] == 1 and len(depth) == insights.DEPTH_POINTS
    assert depth[1][0] == T0 + timedelta(hours=1)


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


def test_it_keeps_a_long_names_label_out_of_its_bar_and_count():
    """An MCP tool's name is long: its label is clipped to the label column, whole in its tooltip and the table."""
    name = "mcp.github.create_pull_request_review_comment"
    chart = ElementTree.fromstring(insights.rates_chart("By tool", {name: insights.Rates(approved=3)}))
    [column] = [box for box in chart.findall("svg") if box.find("text[@class='bar-name']") is not None]
    label, bar = column.find("text[@class='bar-name']"), chart.find("rect")

    # A nested <svg> clips what overflows it: the label ends where the bars begin.
    assert float(column.get("x", "0")) + float(column.get("width")) <= float(bar.get("x"))
    assert label.text == name and label.find("title").text == name
