"""The audit page (admins): every decision attempt, filters, the edit diff, the CSV export."""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.http.response import HttpResponseBase
from django.utils import timezone

from agents import services
from agents.models import Approval, AuditEntry
from tests.dashboard.conftest import REFUND
from tests.support.asgi import http_scope
from tests.support.flows import EXPORT_READS_COMMITTED, decide, pending, start


@pytest.fixture
def history(db: None) -> Approval:
    """Bob approves with an edit; alice tries to reject it afterwards; dave's id is unknown."""
    [approval] = pending(start(REFUND))
    decide(
        approval,
        "approved",
        by="bob",
        arguments={"order_id": "A1001", "amount_cents": 1500},
        note="half now",
        auto_resume=False,
    )
    with pytest.raises(services.AlreadyDecided):
        services.approval_decide(
            approval_id=approval.id,
            decision="rejected",
            attempt=services.Attempt(actor="alice", source="web", origin="10.0.0.7"),
        )
    with pytest.raises(services.NotFound):
        decide("appr_missing", "approved", by="dave")
    return approval


def csv_body(response: HttpResponseBase) -> str:
    """Return the whole CSV export, read from its async iterator as an ASGI server would."""
    assert response.streaming and response.is_async

    async def read() -> bytes:
        return b"".join([part async for part in response.streaming_content])

    return async_to_sync(read)().decode()


def rows(html: str) -> int:
    return html.count('<tr class="outcome-')


def test_it_lists_every_attempt_with_who_what_when_where_and_outcome(client_for, carol, history):
    html = client_for(carol).get("/audit").content.decode()

    assert rows(html) == 3
    assert "already_decided" in html and "Already Decided" in html and "Not Found" in html
    assert "10.0.0.7" in html and "web" in html and "cli" in html
    assert "“half now”" in html
    # The edited-argument diff: proposed → approved.
    assert "<td><code>amount_cents</code></td><td><del>2500</del></td><td><ins>1500</ins></td>" in html
    assert f'href="/approvals/{history.id}"' in html


def test_it_filters_by_person_tool_outcome_and_date(client_for, carol, history):
    client = client_for(carol)
    today = timezone.now().date()

    assert rows(client.get("/audit?person=alice").content.decode()) == 1
    assert rows(client.get("/audit?tool=refund_request").content.decode()) == 2
    assert rows(client.get("/audit?outcome=not_found").content.decode()) == 1
    assert rows(client.get(f"/audit?since={today}&until={today}").content.decode()) == 3
    later = client.get(f"/audit?since={today + timedelta(days=1)}").content.decode()
    assert rows(later) == 0 and "No entries match these filters." in later
    assert rows(client.get(f"/audit?until={today - timedelta(days=1)}").content.decode()) == 0


def test_it_says_so_when_a_filter_is_malformed(client_for, carol, history):
    html = client_for(carol).get("/audit?since=yesterday").content.decode()

    assert "Enter a valid date." in html and rows(html) == 0


@EXPORT_READS_COMMITTED
def test_it_exports_the_filtered_history_as_csv(client_for, carol, history):
    response = client_for(carol).get("/audit.csv?tool=refund_request")

    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="agentfast-audit-')
    table = list(csv.DictReader(io.StringIO(csv_body(response))))
    # Oldest first, like a log.
    assert [(r["actor"], r["outcome"]) for r in table] == [("bob", "decided"), ("alice", "already_decided")]
    assert table[0]["arguments_diff"] == '{"amount_cents": [2500, 1500]}'
    assert table[0]["note"] == "half now" and table[1]["origin"] == "10.0.0.7"


@EXPORT_READS_COMMITTED
def test_a_script_exports_with_an_admins_api_token(client, carol, history):
    token = services.token_create(username="carol")[1]

    response = client.get("/audit.csv?tool=refund_request", headers={"Authorization": f"Bearer {token}"})

    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(csv_body(response))))
    assert [(r["actor"], r["outcome"]) for r in table] == [("bob", "decided"), ("alice", "already_decided")]


def test_a_reviewers_token_may_not_export_and_a_wrong_one_is_told_not_redirected(client, bob, history):
    reviewer = services.token_create(username="bob")[1]

    refused = client.get("/audit.csv", headers={"Authorization": f"Bearer {reviewer}"})
    unknown = client.get("/audit.csv", headers={"Authorization": "Bearer af_not-a-token"})

    assert refused.status_code == 403
    assert unknown.status_code == 401 and unknown["WWW-Authenticate"] == 'Bearer realm="agentfast"'
    assert unknown.content == b"the bearer token is unknown or revoked\n"


@EXPORT_READS_COMMITTED
def test_it_defuses_spreadsheet_formulas_in_the_csv(client_for, carol, approval):
    decide(approval, "rejected", by="bob", note='=HYPERLINK("http://evil")')

    body = csv_body(client_for(carol).get("/audit.csv"))

    [row] = list(csv.DictReader(io.StringIO(body)))
    assert row["note"] == '\'=HYPERLINK("http://evil")'


def test_it_explains_an_empty_history(client_for, carol):
    assert "No decisions yet." in client_for(carol).get("/audit").content.decode()


def test_it_keeps_the_audit_append_only_in_the_admin(client_for, carol, history):
    client = client_for(carol)
    entry = AuditEntry.objects.first()

    assert client.get("/admin/agents/auditentry/").status_code == 200
    assert client.get("/admin/agents/auditentry/add/").status_code == 403
    assert client.get(f"/admin/agents/auditentry/{entry.pk}/delete/").status_code == 403
    change = client.post(f"/admin/agents/auditentry/{entry.pk}/change/", {"actor": "mallory"})
    assert change.status_code == 403
    bulk = client.post(
        "/admin/agents/auditentry/", {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"}
    )
    assert bulk.status_code in (200, 302)
    assert AuditEntry.objects.count() == 3 and AuditEntry.objects.get(pk=entry.pk).actor != "mallory"


def test_it_keeps_the_django_admin_for_admins(client_for, alice, carol):
    assert client_for(alice).get("/admin/").status_code == 302  # not staff: the admin's own login
    assert client_for(carol).get("/admin/").status_code == 200
    assert client_for(carol).get("/admin/agents/approval/").status_code == 200


@EXPORT_READS_COMMITTED
@pytest.mark.parametrize(
    "note",
    [" =1+1", "\n=1+1", "\r\n@SUM(A1)", "＝1+1", "＋1", "－1", "＠SUM(A1)", "\t=1", "  -2+3"],
    ids=[
        "space",
        "newline",
        "crlf",
        "fullwidth-equals",
        "fullwidth-plus",
        "fullwidth-minus",
        "fullwidth-at",
        "tab",
        "spaces",
    ],
)
def test_it_defuses_formulas_behind_spaces_newlines_and_fullwidth_signs(client_for, carol, approval, note):
    decide(approval, "rejected", by="bob", note=note)

    [row] = list(csv.DictReader(io.StringIO(csv_body(client_for(carol).get("/audit.csv")))))

    assert row["note"].startswith("'") and row["note"][1:].strip() == note.strip()


@EXPORT_READS_COMMITTED
def test_it_accepts_the_last_day_there_is_as_a_filter(client_for, carol, history):
    client = client_for(carol)

    page = client.get("/audit?until=9999-12-31")
    export = client.get("/audit.csv?until=9999-12-31&since=9999-12-31")

    assert page.status_code == 200 and rows(page.content.decode()) == 3
    assert export.status_code == 200 and len(csv_body(export).splitlines()) == 1  # the header alone


@EXPORT_READS_COMMITTED
def test_it_streams_the_csv_under_asgi_while_reading_it(client_for, carol, history):
    """Django's ASGI handler sends each part as the async iterator yields it, never the whole export first.

    The test's `send` adds an audit entry when the first part (the header) arrives: a
    buffered export was read whole before that and cannot contain it; a streamed one can.
    """
    from django.core import signals
    from django.core.handlers.asgi import ASGIHandler
    from django.db import close_old_connections

    cookie = client_for(carol).cookies["sessionid"].value
    scope = http_scope("/audit.csv", [(b"cookie", f"sessionid={cookie}".encode())])
    parts: list[bytes] = []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, object]:
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    def late_attempt() -> None:
        with pytest.raises(services.NotFound):
            decide("appr_late", "approved", by="dave")  # audited as not found

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200
        elif message["type"] == "http.response.body" and message.get("body"):
            if not parts:
                await sync_to_async(late_attempt)()
            parts.append(message["body"])  # type: ignore[arg-type]

    # As Django's test client does: the test's transaction must outlive the request.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        async_to_sync(ASGIHandler())(scope, receive, send)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)

    table = list(csv.DictReader(io.StringIO(b"".join(parts).decode())))
    assert len(parts) >= 2  # the header went out before any row was read
    assert [r["approval_id"] for r in table][-1] == "appr_late"
    assert len(table) == 4


@EXPORT_READS_COMMITTED
def test_it_lists_who_cancelled_a_run_and_from_where(client_for, carol, paused):
    attempt = services.Attempt(actor="carol", source="api", origin="10.0.0.9")
    services.run_cancel(run_id=paused.id, attempt=attempt)

    response = client_for(carol).get("/audit?person=carol")

    html = response.content.decode()
    assert response.status_code == 200 and rows(html) == 2  # the cancel, and the approval it expired
    assert f'href="/runs/{paused.id}"' in html and "10.0.0.9" in html and "cancelled" in html
    [row] = [
        r
        for r in csv.DictReader(io.StringIO(csv_body(client_for(carol).get("/audit.csv"))))
        if r["action"] == "cancelled"
    ]
    assert (row["actor"], row["source"], row["origin"], row["run_id"]) == ("carol", "api", "10.0.0.9", paused.id)


def test_it_pages_the_audit_without_counting_it(client_for, carol, history, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.web import audit as audit_pages

    monkeypatch.setattr(audit_pages, "AUDIT_PAGE_SIZE", 2)
    client = client_for(carol)

    with CaptureQueriesContext(connection) as queries:
        first = client.get("/audit").content.decode()
    second = client.get("/audit?page=2").content.decode()

    assert rows(first) == 2 and "page=2" in first
    assert rows(second) == 1 and "page=3" not in second
    assert not [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"] or "DISTINCT" in q["sql"]]


def test_it_offers_users_and_tools_to_filter_by_and_keeps_what_was_typed(client_for, carol, history):
    html = client_for(carol).get("/audit?person=dave").content.decode()

    assert '<option value="carol">' in html and '<option value="refund_request">' in html
    assert '<option value="dave" selected>dave</option>' in html  # no longer a user, still filtered by
    assert rows(html) == 1


@EXPORT_READS_COMMITTED
def test_it_exports_non_ascii_notes_as_written_in_both_note_and_detail(client_for, carol, approval):
    decide(approval, "rejected", by="bob", note="Größe – 払い戻し")

    rows = list(csv.DictReader(io.StringIO(csv_body(client_for(carol).get("/audit.csv")))))

    [row] = [r for r in rows if r["action"] == "rejected"]
    assert row["note"] == "Größe – 払い戻し"
    assert '"note": "Größe – 払い戻し"' in row["detail"] and "\\u" not in row["detail"]
