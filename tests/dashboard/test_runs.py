"""Runs: the list with its search and filters, one run's summary, timeline and Cancel."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from agents import services
from agents.models import AuditEntry, Run
from dashboard.web import playground
from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, resume, start


def run_ids(html: str) -> list[str]:
    return re.findall(r'<tr class="run-row status-\w+" data-run-id="([^"]+)">', html)


def test_it_lists_runs_newest_first_with_what_waits(client_for, alice):
    first, second = start(REFUND), start("hello")

    html = client_for(alice).get("/runs").content.decode()

    assert run_ids(html) == [second.id, first.id]
    assert "1 waiting" in html and "suspended" in html and "completed" in html


def test_it_filters_runs_by_status(client_for, alice):
    suspended, completed = start(REFUND), start("hello")
    client = client_for(alice)

    assert run_ids(client.get("/runs?status=suspended").content.decode()) == [suspended.id]
    assert run_ids(client.get("/runs?status=completed").content.decode()) == [completed.id]
    empty = client.get("/runs?status=failed").content.decode()
    assert run_ids(empty) == [] and "No failed runs match these filters." in empty
    assert run_ids(client.get("/runs?status=bogus").content.decode()) == [suspended.id, completed.id][::-1]


def test_it_explains_how_to_start_when_there_are_no_runs(client_for, alice):
    html = client_for(alice).get("/runs").content.decode()

    assert "No runs yet." in html and "agentfast runs start" in html


def test_it_shows_a_runs_timeline_from_pause_to_finish(client_for, alice):
    run = start(REFUND)
    [approval] = pending(run)
    decide(approval, "approved", by="bob", arguments={"order_id": "A1001", "amount_cents": 1500}, auto_resume=False)
    run = resume(run)

    html = client_for(alice).get(f"/runs/{run.id}").content.decode()

    kinds = re.findall(r'<li id="event-\d+" class="event type-(\w+)">', html)
    assert kinds[:5] == ["message", "tool_call", "tool_result", "approval_required", "approval_decided"]
    assert kinds[-3:] == ["tool_result", "message", "run_status"]
    assert REFUND in html and 'id="run-status" class="badge status-completed"' in html
    assert "by bob · with edited arguments" in html
    assert "Refunded 15.00 USD for order A1001" in html
    assert f'ws-connect="/ws/runs/{run.id}/"' in html


def test_it_answers_htmx_with_the_timeline_partial(client_for, alice, paused):
    response = client_for(alice).get(f"/runs/{paused.id}", headers={"HX-Request": "true"})

    html = response.content.decode()
    assert html.lstrip().startswith('<ol id="timeline"') and "<html" not in html
    assert 'id="run-status" class="badge status-suspended" hx-swap-oob="true"' in html


def test_it_keeps_the_timeline_fragment_out_of_the_cache_of_the_run_url(client_for, alice, paused):
    client = client_for(alice)

    for path in (f"/runs/{paused.id}", "/runs"):
        for response in (client.get(path, headers={"HX-Request": "true"}), client.get(path)):
            assert "HX-Request" in response["Vary"]
            assert "no-store" in response["Cache-Control"]


def test_it_answers_404_for_an_unknown_run(client_for, alice):
    assert client_for(alice).get("/runs/run_nope").status_code == 404


COMPOSED = {"description": "Composed in the playground.", "model": "demo", "system_prompt": "", "tools": ["send_email"]}


def queued(prompt: str, *, composed: bool = False, by: str = "bob") -> Run:
    agent, config = (playground.composed_name(COMPOSED), COMPOSED) if composed else ("support", None)
    return services.run_create(agent=agent, agent_config=config, input=prompt, created_by=by, enqueue=False)


def test_it_links_each_run_by_its_prompt_with_a_short_id(client_for, alice):
    run = queued("Refund order A1001 for 25.00 USD")

    html = client_for(alice).get("/runs").content.decode()

    assert f'<a class="run-link" href="/runs/{run.id}">Refund order A1001 for 25.00 USD</a>' in html
    assert f"…{run.id[-8:]}</code>" in html


def test_it_searches_prompts_and_filters_by_agent_creator_and_date(client_for, alice):
    refund = queued("Refund order A1001 for 25.00 USD", by="bob")
    email = queued("Email bob@example.com that it shipped", composed=True, by="carol")
    client = client_for(alice)

    assert run_ids(client.get("/runs?q=a1001").content.decode()) == [refund.id]
    assert run_ids(client.get(f"/runs?q={email.id[-8:]}").content.decode()) == [email.id]
    assert run_ids(client.get(f"/runs?agent={email.agent}").content.decode()) == [email.id]
    assert run_ids(client.get("/runs?creator=bob").content.decode()) == [refund.id]
    today = timezone.localdate()
    assert run_ids(client.get(f"/runs?since={today}&until={today}").content.decode()) == [email.id, refund.id]
    assert run_ids(client.get(f"/runs?since={today + timedelta(days=1)}").content.decode()) == []
    assert run_ids(client.get(f"/runs?q=a1001&agent={email.agent}").content.decode()) == []


def test_it_names_a_composed_agent_by_its_tools_and_model(client_for, alice):
    queued("hello", composed=True)

    html = client_for(alice).get("/runs").content.decode()

    assert "<td>composed: send_email · demo</td>" in html


def test_it_refuses_a_search_with_unreadable_text(client_for, alice):
    queued("hello")

    response = client_for(alice).get("/runs?q=a%00b")

    assert response.status_code == 400 and "search" in response.content.decode()
    assert run_ids(response.content.decode()) == []


def test_it_shows_failed_runs_in_red_with_their_error_and_duration(client_for, alice):
    run = queued("hello")
    services.run_fail(run_id=run.id, owner=None, error="the model endpoint refused the key")

    html = client_for(alice).get("/runs").content.decode()

    assert f'<tr class="run-row status-failed" data-run-id="{run.id}">' in html
    assert '<span class="error-text">the model endpoint refused the key</span>' in html
    assert re.search(r'<td class="nowrap duration">[\d.]+ (ms|s)</td>', html)


def test_it_opens_a_run_with_its_summary_and_the_pending_approval_as_a_button(client_for, alice, paused):
    [approval] = pending(paused)

    html = client_for(alice).get(f"/runs/{paused.id}").content.decode()

    summary = html[html.index('id="run-summary"') : html.index("<h2>Prompt</h2>")]
    assert "suspended" in summary and "1, 1 waiting" in summary
    assert f'<a class="button primary" href="/approvals/{approval.id}">Decide refund_request · waiting' in summary
    assert f'action="/runs/{paused.id}/cancel"' in summary and "csrfmiddlewaretoken" in summary


def test_it_labels_a_reviewers_note_and_feedback_as_the_reviewers(client_for, alice, paused):
    [approval] = pending(paused)
    decide(approval, "rejected", by="alice", note="too much", feedback="Refund 10.00 instead")

    html = client_for(alice).get(f"/runs/{paused.id}").content.decode()

    assert "alice’s note:</span> too much" in html
    assert "Feedback from reviewer alice (sent to the model):</span> Refund 10.00 instead" in html
    assert re.search(r"waited [\d.]+ (ms|s) for alice", html)


def test_it_cancels_a_run_from_its_page_and_audits_who(client_for, alice, paused):
    client = client_for(alice)

    response = client.post(f"/runs/{paused.id}/cancel")

    assert response.status_code == 302 and response["Location"] == f"/runs/{paused.id}"
    paused.refresh_from_db()
    assert paused.status == Run.Status.CANCELLED
    entry = AuditEntry.objects.filter(run_id=paused.id, action="cancelled").get()
    assert (entry.actor, entry.source) == ("alice", "web")
    assert "Cancel run" not in client.get(f"/runs/{paused.id}").content.decode()


FINANCE_ONLY = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend, approvers: [finance]}
"""


@pytest.mark.parametrize(
    ("who", "cancels"),
    [("erin", False), ("alice", True), ("bob", True), ("carol", True)],
    ids=["not-an-approver", "an-approver", "the-runs-starter", "an-admin"],
)
def test_it_lets_only_who_may_decide_its_calls_cancel_a_run(client_for, agent_config, alice, bob, carol, who, cancels):
    # A cancel stops the waiting refund as a rejection would: erin, a reviewer outside finance, may do neither.
    agent_config(FINANCE_ONLY)
    services.user_set_groups(username="alice", groups=("finance",))
    erin, _ = services.user_create(username="erin", role="reviewer")
    run = start(REFUND)  # started by bob
    user = {"alice": alice, "bob": bob, "carol": carol, "erin": erin}[who]

    response = client_for(user).post(f"/runs/{run.id}/cancel")

    run.refresh_from_db()
    entry = AuditEntry.objects.get(run_id=run.id, action="cancelled")
    assert entry.actor == who
    if cancels:
        assert response.status_code == 302 and run.status == Run.Status.CANCELLED
        assert entry.outcome == AuditEntry.Outcome.DECIDED
    else:
        page = response.content.decode()
        assert response.status_code == 403 and "Not cancelled: erin is not among the approvers" in page
        assert run.status == Run.Status.SUSPENDED and pending(run)
        assert entry.outcome == AuditEntry.Outcome.NOT_PERMITTED and "approvers" in entry.detail["error"]


def test_it_says_why_an_ended_run_cannot_be_cancelled(client_for, alice):
    run = start("hello")

    response = client_for(alice).post(f"/runs/{run.id}/cancel")

    assert response.status_code == 409
    assert "Not cancelled: run" in response.content.decode() and "completed" in response.content.decode()


def test_it_cancels_only_with_a_csrf_token(alice, paused):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)

    assert client.post(f"/runs/{paused.id}/cancel").status_code == 403
    paused.refresh_from_db()
    assert paused.status == Run.Status.SUSPENDED


def test_it_pages_runs_without_counting_them(client_for, alice, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.web import runs as run_pages

    monkeypatch.setattr(run_pages, "RUNS_PAGE_SIZE", 2)
    oldest, middle, newest = start("hello"), start(REFUND), start("hello")
    client = client_for(alice)

    with CaptureQueriesContext(connection) as queries:
        first = client.get("/runs").content.decode()
    second = client.get("/runs?page=2").content.decode()

    assert run_ids(first) == [newest.id, middle.id] and "page=2" in first and "1 waiting" in first
    assert run_ids(second) == [oldest.id] and "page=1" in second and "page=3" not in second
    assert not [q["sql"] for q in queries.captured_queries if "COUNT(*)" in q["sql"] and "agents_run" in q["sql"]]


def test_it_shows_the_first_page_for_a_page_past_the_end(client_for, alice):
    run = start("hello")

    html = client_for(alice).get("/runs?page=999999999").content.decode()

    assert run_ids(html) == [run.id]


def test_it_shows_a_long_runs_latest_events_and_every_one_when_asked(client_for, alice, monkeypatch):
    from dashboard.web import runs as run_pages

    monkeypatch.setattr(run_pages, "TIMELINE_EVENTS", 3)
    run = start(REFUND)
    pending(run)
    client = client_for(alice)
    every = list(Run.objects.get(pk=run.id).events.order_by("seq").values_list("seq", flat=True))

    latest = client.get(f"/runs/{run.id}").content.decode()
    whole = client.get(f"/runs/{run.id}?all=1").content.decode()

    shown = [int(seq) for seq in re.findall(r'<li id="event-(\d+)"', latest)]
    assert len(every) > 3 and shown == every[-3:]
    assert "Showing the latest 3 events." in latest and 'href="?all=1"' in latest
    assert [int(seq) for seq in re.findall(r'<li id="event-(\d+)"', whole)] == every
    assert "Showing the latest" not in whole and f'hx-get="/runs/{run.id}?all=1"' in whole
