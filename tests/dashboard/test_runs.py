"""Runs: the list with its status filter, and one run's timeline."""

from __future__ import annotations

import re

from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, resume, start


def run_ids(html: str) -> list[str]:
    return re.findall(r'<td><a href="/runs/([^"]+)">', html)


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
    assert run_ids(empty) == [] and "No failed runs." in empty
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


def test_it_pages_runs_without_counting_them(client_for, alice, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard import views

    monkeypatch.setattr(views, "RUNS_PAGE_SIZE", 2)
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
