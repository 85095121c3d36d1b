"""The read-only admin reads a bounded number of rows per list page, however large its tables grow."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents.models import AuditEntry, Run
from dashboard import admin as engine_admin
from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, start


@pytest.fixture
def five_runs(db):  # noqa: ANN001, ANN201
    # Ids in creation order, as ULIDs are from one millisecond to the next.
    Run.objects.bulk_create([Run(id=f"run_{n:026d}", agent=f"agent-{n}", input="hi") for n in range(5)])


def test_a_list_counts_no_further_than_its_cap_and_says_so(client_for, carol, five_runs, monkeypatch):
    monkeypatch.setattr(engine_admin, "COUNT_CAP", 3)

    with CaptureQueriesContext(connection) as queries:
        response = client_for(carol).get("/admin/agents/run/")

    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT 4" in sql for sql in counts)  # one bounded read, no second COUNT(*) of all
    assert "3+ runs" in " ".join(response.content.decode().split())


def test_a_list_under_its_cap_says_its_count(client_for, carol, five_runs):
    response = client_for(carol).get("/admin/agents/run/")

    page = " ".join(response.content.decode().split())
    assert "5 runs" in page and "5+ runs" not in page


def test_a_filter_offers_the_values_of_the_newest_rows_and_still_takes_older_ones(
    client_for, carol, five_runs, monkeypatch
):
    monkeypatch.setattr(engine_admin, "RECENT_ROWS", 2)
    client = client_for(carol)

    with CaptureQueriesContext(connection) as queries:
        page = client.get("/admin/agents/run/").content.decode()

    assert not any("DISTINCT" in q["sql"].upper() for q in queries.captured_queries)  # no scan of every row
    assert "?agent=agent-4" in page and "?agent=agent-3" in page and "?agent=agent-2" not in page
    older = client.get("/admin/agents/run/", {"agent": "agent-0"}).content.decode()
    assert "run_00000000000000000000000000" in older and "run_00000000000000000000000004" not in older


def test_a_request_for_facets_counts_nothing_more(client_for, carol, five_runs):
    client = client_for(carol)

    with CaptureQueriesContext(connection) as plain:
        client.get("/admin/agents/run/")
    with CaptureQueriesContext(connection) as faceted:
        response = client.get("/admin/agents/run/", {"_facets": "True"})

    assert response.status_code in (200, 302)
    assert len(faceted.captured_queries) <= len(plain.captured_queries)


def test_the_audit_search_matches_whole_names_and_ids(client_for, carol, alice):
    run = start(REFUND)
    decide(pending(run)[0], "approved", by="alice")
    client = client_for(carol)

    def results(words: str) -> str:
        return " ".join(client.get("/admin/agents/auditentry/", {"q": words}).content.decode().split())

    count = AuditEntry.objects.filter(actor="alice").count()
    assert count >= 1
    assert f"{count} result" in results("alice") and f"{count} result" in results(run.id)
    assert "0 results" in results("ali")  # a part of a name: the indexes hold whole values


@pytest.mark.parametrize(
    "model", ["run", "message", "toolcall", "approval", "runevent", "auditentry", "sideeffect", "delivery"]
)
def test_every_search_matches_whole_values_on_an_index(client_for, carol, model):
    with CaptureQueriesContext(connection) as queries:
        response = client_for(carol).get(f"/admin/agents/{model}/", {"q": "run_x"})

    assert response.status_code == 200
    reads = [q["sql"] for q in queries.captured_queries if f"agents_{model}" in q["sql"]]
    assert reads and not any("LIKE" in sql.upper() for sql in reads)  # a substring search reads every row
