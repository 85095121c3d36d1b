"""The JSON API in process: every endpoint, its answers and its refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core import signing
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents import schemas, services
from agents.models import Approval, AuditEntry, Run
from tests.support import flows

REFUND = "Refund order A1001 for 25.00 USD"


class Api:
    """A test client that speaks JSON with a bearer token."""

    def __init__(self, client: Client, token: str | None) -> None:
        self.client, self.token = client, token

    def _headers(self, extra: dict[str, str]) -> dict[str, str]:
        return {**({"Authorization": f"Bearer {self.token}"} if self.token else {}), **extra}

    def get(self, path: str, headers: dict[str, str] | None = None, **params: Any) -> Any:
        return self.client.get(path, params, headers=self._headers(headers or {}))

    def post(
        self, path: str, body: Any = None, *, raw: str | None = None, headers: dict[str, str] | None = None
    ) -> Any:
        data = raw if raw is not None else ("" if body is None else json.dumps(body))
        return self.client.post(path, data=data, content_type="application/json", headers=self._headers(headers or {}))


def token_for(username: str) -> str:
    return services.token_create(username=username)[1]


@pytest.fixture
def api(client: Client, alice: User) -> Api:
    return Api(client, token_for("alice"))


@pytest.fixture
def paused(alice: User) -> Run:
    run = flows.start(REFUND)
    assert run.status == Run.Status.SUSPENDED
    return run


def approval_of(run: Run) -> Approval:
    return Approval.objects.get(run=run)


def audits(approval_id: str) -> list[tuple[str, str, str, str]]:
    rows = AuditEntry.objects.filter(approval_id=approval_id).order_by("id")
    return list(rows.values_list("actor", "on_behalf_of", "source", "outcome"))


def roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value))


# -- runs --------------------------------------------------------------------------------


def test_it_creates_a_run_as_the_token_user(api: Api, django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        response = api.post("/api/runs", {"agent": "support", "input": REFUND, "auto_resume": False})
    assert response.status_code == 201
    run = Run.objects.get()
    assert response.json() == roundtrip(schemas.RunDetail.of(run).as_json())
    assert (run.created_by, run.auto_resume, run.status) == ("alice", False, Run.Status.QUEUED)
    assert len(callbacks) == 1  # the worker's drive, enqueued on commit


def test_it_refuses_an_unknown_agent_naming_the_field(api: Api) -> None:
    response = api.post("/api/runs", {"agent": "nobody", "input": REFUND})
    assert response.status_code == 400
    assert response.json()["error_code"] == "invalid"
    assert response.json()["field"] == "agent"
    message = response.json()["message"]
    assert message.startswith("unknown agent 'nobody' (") and "support" in message
    assert "/" not in message  # the server's folders are its own
    assert not Run.objects.exists()


def test_it_says_the_server_cannot_start_a_run_while_its_config_file_cannot_be_read(
    api: Api, agent_config: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    path = agent_config("agents: [unclosed\n")

    response = api.post("/api/runs", {"agent": "support", "input": REFUND})

    assert response.status_code == 503  # the server's fault, not the request's
    body = response.json()
    assert body["error_code"] == "unavailable" and "agentfast.yaml cannot be read" in body["message"]
    assert str(path) not in body["message"] and "field" not in body
    assert str(path) in caplog.text and "not valid YAML" in caplog.text  # the operator reads why
    assert not Run.objects.exists()


def test_it_lists_runs_newest_first_a_page_at_a_time(api: Api) -> None:
    runs = [services.run_create(agent="support", input=f"prompt {n}", enqueue=False) for n in range(3)]
    first = api.get("/api/runs", limit=2).json()
    assert first["count"] == 3
    assert [item["id"] for item in first["items"]] == [runs[2].id, runs[1].id]
    assert first["items"][0] == roundtrip(schemas.RunSummary.of(runs[2]).as_json())
    second = api.get("/api/runs", limit=2, offset=2).json()
    assert [item["id"] for item in second["items"]] == [runs[0].id]
    assert api.get("/api/runs", status="completed").json()["count"] == 0


def test_it_shows_a_run_in_the_cli_json_shape(api: Api, paused: Run) -> None:
    response = api.get(f"/api/runs/{paused.id}")
    assert response.status_code == 200
    assert response.json() == roundtrip(schemas.RunDetail.of(paused).as_json())


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/runs/run_nope"),
        ("post", "/api/runs/run_nope/resume"),
        ("post", "/api/runs/run_nope/cancel"),
        ("get", "/api/runs/run_nope/events"),
        ("get", "/api/approvals/appr_nope"),
    ],
)
def test_it_answers_404_for_unknown_ids(api: Api, method: str, path: str) -> None:
    response = getattr(api, method)(path)
    assert response.status_code == 404
    assert response.json()["error_code"] == "not_found"


def test_it_answers_a_json_404_for_unknown_api_urls(api: Api) -> None:
    response = api.get("/api/nothing/here")
    assert response.status_code == 404
    assert response.json()["error_code"] == "not_found"


@pytest.mark.parametrize(
    ("method", "path", "status", "code", "allow"),
    [
        ("post", "/api/nothing/here", 404, "not_found", None),
        ("post", "/api/runs/", 404, "not_found", None),
        ("get", "/api/", 404, "not_found", None),
        ("put", "/api/runs", 405, "method_not_allowed", "GET, HEAD, POST"),
        ("delete", "/api/runs/run_x", 405, "method_not_allowed", "GET, HEAD"),
        ("put", "/api/events", 405, "method_not_allowed", "GET, HEAD"),  # an async endpoint
        ("post", "/api/openapi.json", 405, "method_not_allowed", "GET, HEAD"),
    ],
)
def test_it_answers_unknown_urls_and_methods_in_json_even_to_a_csrf_checking_client(
    alice: User, method: str, path: str, status: int, code: str, allow: str | None
) -> None:
    client = Client(enforce_csrf_checks=True)
    headers = {"Authorization": f"Bearer {token_for('alice')}"}

    body = {} if method == "get" else {"data": "{}", "content_type": "application/json"}
    response = getattr(client, method)(path, headers=headers, **body)

    assert (response.status_code, response.json()["error_code"]) == (status, code)
    assert response.get("Allow") == allow


def test_it_still_enforces_csrf_on_a_sessions_post_to_a_real_endpoint(alice: User) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)

    refused = browser.post(
        "/api/runs", json.dumps({"agent": "support", "input": "hi"}), content_type="application/json"
    )

    assert (refused.status_code, refused.json()["error_code"]) == (403, "csrf_failed")
    assert not Run.objects.exists()


def test_it_cancels_a_run_and_expires_its_approvals(api: Api, paused: Run) -> None:
    response = api.post(f"/api/runs/{paused.id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert approval_of(paused).status == Approval.Status.EXPIRED
    again = api.post(f"/api/runs/{paused.id}/cancel")
    assert again.status_code == 422
    assert again.json()["error_code"] == "wrong_state"


def test_it_resumes_a_run_only_once_its_approvals_are_decided(
    api: Api, paused: Run, django_capture_on_commit_callbacks: Any
) -> None:
    waiting = api.post(f"/api/runs/{paused.id}/resume")
    assert waiting.status_code == 422
    assert approval_of(paused).id in waiting.json()["message"]
    flows.decide(approval_of(paused), "approved", auto_resume=False)
    with django_capture_on_commit_callbacks() as callbacks:
        response = api.post(f"/api/runs/{paused.id}/resume")
    assert response.status_code == 200
    assert response.json()["id"] == paused.id
    assert len(callbacks) == 1  # the resume, enqueued for a worker


def test_it_refuses_to_resume_a_completed_run(api: Api) -> None:
    run = flows.start("Refund order Z9999 for 1.00 USD")  # no such order: the model says so and ends
    assert run.status == Run.Status.COMPLETED
    response = api.post(f"/api/runs/{run.id}/resume")
    assert response.status_code == 422
    assert response.json()["error_code"] == "wrong_state"


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream"])
def test_it_answers_409_with_the_lease_holder_when_a_run_is_being_driven(api: Api, accept: str) -> None:
    run = services.run_create(agent="support", input=REFUND, enqueue=False)
    assert services.run_lease(run_id=run.id, owner="worker-7") is not None
    response = api.post(f"/api/runs/{run.id}/resume", headers={"Accept": accept})
    assert response.status_code == 409
    body = response.json()
    assert (body["error_code"], body["lease_owner"]) == ("lease_held", "worker-7")
    assert "worker-7" in body["message"]


# -- approvals ---------------------------------------------------------------------------


def test_it_lists_pending_approvals_filtered_and_paginated(api: Api, paused: Run) -> None:
    other = flows.start("Refund order A1002 for 15.00 USD")
    listed = api.get("/api/approvals").json()
    assert listed["count"] == 2
    assert listed["items"][0] == roundtrip(schemas.ApprovalSummary.of(approval_of(other)).as_json())
    assert api.get("/api/approvals", tool="refund_request", limit=1).json()["count"] == 2
    assert len(api.get("/api/approvals", limit=1, offset=1).json()["items"]) == 1
    assert api.get("/api/approvals", agent="elsewhere").json()["count"] == 0
    assert api.get("/api/approvals", status="", agent="", tool="").json()["count"] == 2  # an empty form
    flows.decide(approval_of(other), "rejected", note="no")
    assert api.get("/api/approvals").json()["count"] == 1
    assert api.get("/api/approvals", status="all").json()["count"] == 2


def page_counts(page: dict[str, Any]) -> tuple[int, bool, bool, int]:
    return page["count"], page["count_capped"], page["has_more"], len(page["items"])


def test_it_counts_a_list_no_further_than_its_cap_past_the_offset(
    api: Api, paused: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    flows.start("Refund order A1002 for 15.00 USD")
    flows.start("Refund order A1002 for 16.00 USD")
    assert page_counts(api.get("/api/approvals").json()) == (3, False, False, 3)
    assert page_counts(api.get("/api/approvals", limit=2).json()) == (3, False, True, 2)
    monkeypatch.setattr("dashboard.api.pages.COUNT_CAP", 1)
    assert page_counts(api.get("/api/approvals", limit=1).json()) == (1, True, True, 1)  # "1+"
    assert page_counts(api.get("/api/approvals", limit=1, offset=1).json()) == (2, True, True, 1)
    assert page_counts(api.get("/api/approvals", limit=1, offset=2).json()) == (3, False, False, 1)
    assert page_counts(api.get("/api/approvals", limit=2, offset=2).json()) == (3, False, False, 1)
    assert page_counts(api.get("/api/approvals", offset=5).json()) == (3, False, False, 0)  # past the end
    assert page_counts(api.get("/api/runs", limit=1).json()) == (1, True, True, 1)


def pages_by_cursor(api: Api, path: str, **params: Any) -> list[list[str]]:
    """Return the ids of every page of a list, following next_cursor from the first page."""
    pages, cursor = [], None
    while True:
        page = api.get(path, **params, **({"cursor": cursor} if cursor else {})).json()
        pages.append([item["id"] for item in page["items"]])
        cursor = page["next_cursor"]
        assert (cursor is not None) == page["has_more"]
        if cursor is None:
            return pages


def test_it_pages_approvals_by_cursor_and_rows_added_or_decided_meanwhile_shift_nothing(api: Api, paused: Run) -> None:
    older = [flows.start(f"Refund order A100{n} for 1{n}.00 USD") for n in range(2, 5)]
    newest_first = [approval_of(run).id for run in [*older[::-1], paused]]
    first = api.get("/api/approvals", limit=2).json()
    assert [item["id"] for item in first["items"]] == newest_first[:2]
    assert (first["count"], first["has_more"], first["offset"]) == (4, True, 0)
    flows.start("Refund order A1009 for 19.00 USD")  # newer: before the cursor, on no later page
    flows.decide(newest_first[0], "approved")  # on the page already shown: the next page starts where it did
    second = api.get("/api/approvals", limit=2, cursor=first["next_cursor"]).json()
    assert [item["id"] for item in second["items"]] == newest_first[2:]
    assert (second["count"], second["has_more"], second["next_cursor"]) == (2, False, None)
    assert api.get("/api/approvals", limit=1, offset=1).json()["next_cursor"]  # an offset page hands on a cursor too


def test_it_pages_runs_of_the_same_moment_by_id_each_once(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    moment = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: moment)  # five runs created in one microsecond
    for n in range(5):
        services.run_create(agent="support", input=f"prompt {n}", enqueue=False)
    monkeypatch.undo()
    in_order = list(Run.objects.order_by("-created_at", "-id").values_list("id", flat=True))  # the database's collation
    pages = pages_by_cursor(api, "/api/runs", limit=2)
    assert pages == [in_order[:2], in_order[2:4], in_order[4:]]
    assert pages_by_cursor(api, "/api/runs", limit=2, status="queued") == pages
    assert pages_by_cursor(api, "/api/runs", status="completed") == [[]]


def _signed(value: Any, **signer: Any) -> str:
    return signing.Signer(salt="agentfast.api.cursor", **signer).sign_object(value)


SIGNED_WRONG = [  # signed as the API signs: only their contents are wrong
    {"not": "a position"},
    ["approvals", "yesterday", "appr_x"],
    ["approvals", "2026-01-01T00:00:00", "appr_x"],  # no time zone
    ["approvals", "2026-01-01T00:00:00+00:00", 7],
    ["runs", "2026-01-01T00:00:00+00:00", "run_x"],  # a cursor of GET /api/runs
]


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        "%ED%A0%80",  # a lone surrogate's UTF-8 (the server reads U+FFFD)
        "%00",
        "%F0%9F%98%80:abc",
        "A" * 1001,
        "tampered",
        "another key",
        *(f"signed {n}" for n in range(len(SIGNED_WRONG))),
    ],
)
def test_it_refuses_a_cursor_it_did_not_return_naming_the_field(api: Api, paused: Run, cursor: str) -> None:
    flows.start("Refund order A1002 for 15.00 USD")
    if cursor == "tampered":
        real = api.get("/api/approvals", limit=1).json()["next_cursor"]
        cursor = real[:5] + ("B" if real[5] == "A" else "A") + real[6:]
    elif cursor == "another key":
        cursor = _signed(["approvals", "2026-01-01T00:00:00+00:00", "appr_x"], key="another secret key")
    elif cursor.startswith("signed "):
        cursor = _signed(SIGNED_WRONG[int(cursor.split()[1])])
    response = api.get(f"/api/approvals?limit=1&cursor={cursor}")
    assert response.status_code == 400
    assert response.json()["field"] == "cursor"
    assert response.json()["message"].startswith("cursor: ")


def test_it_refuses_a_cursor_with_an_offset_and_takes_an_empty_one_for_none(api: Api, paused: Run) -> None:
    flows.start("Refund order A1002 for 15.00 USD")
    cursor = api.get("/api/approvals", limit=1).json()["next_cursor"]
    both = api.get("/api/approvals", cursor=cursor, offset=1)
    assert (both.status_code, both.json()["field"]) == (400, "offset")
    assert api.get("/api/approvals", cursor="").json()["count"] == 2  # a form left blank: the first page


@pytest.mark.parametrize(
    ("params", "field"), [({"status": "maybe"}, "status"), ({"limit": "0"}, "limit"), ({"offset": "-1"}, "offset")]
)
def test_it_refuses_bad_list_parameters_naming_them(api: Api, params: dict[str, str], field: str) -> None:
    response = api.get("/api/approvals", **params)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_it_shows_an_approval_in_the_cli_json_shape(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    response = api.get(f"/api/approvals/{approval.id}")
    assert response.status_code == 200
    assert response.json() == roundtrip(schemas.ApprovalDetail.of(approval).as_json())


def test_it_approves_as_the_token_user_and_enqueues_the_resume(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    response = api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved", "note": "fine"})
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["decided_by"], body["note"]) == ("approved", "alice", "fine")
    assert (body["outcome"], body["resume_enqueued"]) == ("decided", True)
    assert audits(approval.id) == [("alice", "", "api", "decided")]


# What one decide costs on each database, counted without the test's savepoints: the
# token with its user and their permissions, then under the locks the approval; the
# event's seq (and whether the step waits on more), the approval, the call, the vote and
# the event; the audit chain's head and the audit row. On PostgreSQL the run's lock rides
# in the locked read, the five writes with the audit chain's lock are one statement, and
# the audit row reads the head itself.
DECIDE_STATEMENTS = {"sqlite": 9, "postgresql": 4}


def test_it_decides_in_a_fixed_number_of_statements(
    api: Api, paused: Run, django_capture_on_commit_callbacks: Any
) -> None:
    warm_up = flows.start(REFUND)  # the token's first use records it (once a minute)
    api.post(f"/api/approvals/{approval_of(warm_up).id}/decide", {"decision": "approved"})
    approval = approval_of(paused)

    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved"})

    assert (response.status_code, response.json()["outcome"]) == (200, "decided")
    statements = [query["sql"] for query in queries.captured_queries if "SAVEPOINT" not in query["sql"]]
    assert len(statements) == DECIDE_STATEMENTS[connection.vendor], "\n".join(statements)


def test_it_answers_a_decision_as_the_approval_reads_back(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    response = api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved", "note": "fine"})
    body = response.json()
    expected = schemas.Decision.of_decision(approval_of(paused), outcome="decided", resume_enqueued=True)
    assert body == roundtrip(expected.as_json())
    assert [vote["voter"] for vote in body["votes"]] == ["alice"] and body["tally"] == "1 of 1 approvals: alice"


def test_it_leaves_the_resume_to_the_caller_with_auto_resume_false(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    response = api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved", "auto_resume": False})
    assert response.json()["resume_enqueued"] is False
    paused.refresh_from_db()
    assert paused.status == Run.Status.SUSPENDED


def test_it_repeats_the_same_decision_without_effect(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved", "auto_resume": False})
    again = api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved"})
    assert again.status_code == 200
    assert (again.json()["outcome"], again.json()["resume_enqueued"]) == ("idempotent", False)


def test_it_answers_409_with_the_decision_that_stands(api: Api, client: Client, paused: Run, bob: User) -> None:
    approval = approval_of(paused)
    api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved", "auto_resume": False})
    response = Api(client, token_for("bob")).post(f"/api/approvals/{approval.id}/decide", {"decision": "rejected"})
    assert response.status_code == 409
    body = response.json()
    assert body["error_code"] == "already_decided"
    assert (body["approval"]["status"], body["approval"]["decided_by"]) == ("approved", "alice")
    assert approval_of(paused).status == Approval.Status.APPROVED
    assert audits(approval.id)[-1] == ("bob", "", "api", "already_decided")


def test_it_refuses_a_decision_on_an_expired_approval(api: Api, paused: Run) -> None:
    services.run_cancel(run_id=paused.id, attempt=services.Attempt(actor="carol", source="cli"))
    approval = approval_of(paused)
    response = api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved"})
    assert response.status_code == 422
    assert response.json()["error_code"] == "wrong_state"
    assert response.json()["approval"]["status"] == "expired"
    assert audits(approval.id)[-1] == ("alice", "", "api", "expired")


def test_it_approves_edited_arguments_that_fit_the_tool(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    edited = {"order_id": "A1001", "amount_cents": 1000}
    response = api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved", "arguments": edited})
    assert response.status_code == 200
    assert response.json()["edited_arguments"] == edited


def test_it_refuses_edited_arguments_against_the_tool_schema_naming_the_field(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    bad = {"order_id": "A1001", "amount_cents": "lots"}
    response = api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved", "arguments": bad})
    assert response.status_code == 400
    assert response.json()["field"] == "arguments.amount_cents"
    assert approval_of(paused).status == Approval.Status.PENDING
    assert audits(approval.id) == [("alice", "", "api", "invalid_arguments")]


def test_it_rejects_with_feedback_for_the_model(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    body = {"decision": "rejected", "note": "too much", "feedback": "Refund 10.00 USD instead"}
    response = api.post(f"/api/approvals/{approval.id}/decide", body)
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["feedback"]) == ("rejected", "Refund 10.00 USD instead")


def test_it_passes_a_payload_to_a_tool_that_asked(api: Api, alice: User) -> None:
    run = flows.start("Ask a human whether to expedite order A1003")
    approval = approval_of(run)
    assert api.get(f"/api/approvals/{approval.id}").json()["request"]["question"] == "Should we expedite order A1003?"
    response = api.post(
        f"/api/approvals/{approval.id}/decide", {"decision": "approved", "payload": {"answer": "yes, today"}}
    )
    assert response.json()["payload"] == {"answer": "yes, today"}


# -- deciding for someone else -----------------------------------------------------------


def test_it_records_a_decision_on_behalf_of_someone_with_the_permission(client: Client, paused: Run) -> None:
    relay, _ = services.user_create(username="chatbot", role="reviewer")
    relay.user_permissions.add(Permission.objects.get(codename="decide_on_behalf"))
    approval = approval_of(paused)
    response = Api(client, token_for("chatbot")).post(
        f"/api/approvals/{approval.id}/decide",
        {"decision": "approved", "decided_by": "alice", "auto_resume": False},
    )
    assert response.status_code == 200
    assert response.json()["decided_by"] == "alice"
    assert audits(approval.id) == [("chatbot", "alice", "api", "decided")]


def test_it_refuses_deciding_as_someone_else_without_the_permission(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    response = api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved", "decided_by": "bob"})
    assert response.status_code == 403
    assert (response.json()["error_code"], response.json()["field"]) == ("not_permitted", "decided_by")
    assert approval_of(paused).status == Approval.Status.PENDING
    assert audits(approval.id) == [("alice", "bob", "api", "not_permitted")]


def test_it_accepts_decided_by_naming_the_caller(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    response = api.post(
        f"/api/approvals/{approval.id}/decide", {"decision": "approved", "decided_by": "alice", "auto_resume": False}
    )
    assert response.status_code == 200
    assert audits(approval.id) == [("alice", "", "api", "decided")]


# -- bad input: a clear JSON error, nothing changed, audited ----------------------------


@pytest.mark.parametrize(
    ("raw", "code", "field"),
    [
        ('{"decision": "approved",', "malformed_json", None),
        ('{"decision": "approved", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + "}}", "malformed_json", None),
        ('{"decision": "approved", "arguments": {"amount_cents": ' + "9" * 5001 + "}}", "malformed_json", None),
        ('{"decision": "approved", "decidedby": "x"}', "invalid", "decidedby"),
        ('{"decision": "approve"}', "invalid", "decision"),
        ('{"decision": "approved", "auto_resume": "yes"}', "invalid", "auto_resume"),
        ('{"decision": "approved", "note": 5}', "invalid", "note"),
        ('{"decision": "approved", "arguments": [1, 2]}', "invalid", "arguments"),
        ('{"decision": "approved", "note": "a\\u0000b"}', "invalid", "note"),
        ('{"decision": "approved", "payload": {"answer": "\\ud800"}}', "invalid", "payload"),
        ('{"decision": "approved", "arguments": {"amount_cents": 1e400}}', "invalid", "arguments"),
        ('["approved"]', "invalid", "body"),
        ("", "invalid", "body"),
        ('{"decision": "approved", "decision": "rejected"}', "duplicate_key", "decision"),
        (
            '{"decision": "approved", "arguments": {"amount_cents": 1, "amount_cents": 2}}',
            "duplicate_key",
            "amount_cents",
        ),
    ],
)
def test_it_refuses_bad_decision_bodies_and_audits_them(
    api: Api, paused: Run, raw: str, code: str, field: str | None
) -> None:
    approval = approval_of(paused)
    response = api.post(f"/api/approvals/{approval.id}/decide", raw=raw)
    assert response.status_code == 400
    body = response.json()
    assert (body["error_code"], body.get("field")) == (code, field)
    assert body["message"]
    assert ("too long to read" in body["message"]) == ("9" * 5001 in raw)
    assert approval_of(paused).status == Approval.Status.PENDING
    assert audits(approval.id) == [("alice", "", "api", "invalid_arguments")]


def test_it_refuses_a_run_whose_body_names_a_key_twice_and_starts_nothing(api: Api) -> None:
    response = api.post("/api/runs", raw='{"agent": "support", "input": "first", "input": "second"}')

    assert response.status_code == 400
    body = response.json()
    assert (body["error_code"], body["field"]) == ("duplicate_key", "input")
    assert "'input' appears twice" in body["message"]
    assert not Run.objects.exists()


def test_it_refuses_a_body_over_the_limit_with_413(api: Api, paused: Run) -> None:
    approval = approval_of(paused)
    response = api.post(f"/api/approvals/{approval.id}/decide", {"decision": "approved", "note": "x" * 300_000})
    assert response.status_code == 413
    assert response.json()["error_code"] == "body_too_large"
    assert approval_of(paused).status == Approval.Status.PENDING
    assert audits(approval.id) == [("alice", "", "api", "invalid_arguments")]


def test_it_answers_404_for_a_decision_on_an_unknown_approval_and_audits_it(api: Api) -> None:
    response = api.post("/api/approvals/appr_run_nope_call_1/decide", {"decision": "approved"})
    assert response.status_code == 404
    assert audits("appr_run_nope_call_1") == [("alice", "", "api", "not_found")]


# -- who may call it ---------------------------------------------------------------------

ENDPOINTS = [
    ("post", "/api/runs", {"agent": "support", "input": "hi"}),
    ("get", "/api/runs", None),
    ("get", "/api/runs/run_x", None),
    ("post", "/api/runs/run_x/resume", None),
    ("post", "/api/runs/run_x/cancel", None),
    ("get", "/api/runs/run_x/events", None),
    ("get", "/api/approvals", None),
    ("get", "/api/approvals/appr_x", None),
    ("post", "/api/approvals/appr_x/decide", {"decision": "approved"}),
    ("get", "/api/events", None),
]


def _call(api: Api, method: str, path: str, body: Any) -> Any:
    return api.get(path) if method == "get" else api.post(path, body)


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_it_answers_401_without_credentials(client: Client, db: None, method: str, path: str, body: Any) -> None:
    response = _call(Api(client, None), method, path, body)
    assert response.status_code == 401
    assert response.json()["error_code"] == "unauthenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("token", ["af_nope_nope", "not-even-a-token", ""])
def test_it_answers_401_for_an_unknown_token(client: Client, db: None, token: str) -> None:
    response = client.get("/api/approvals", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401


def test_it_answers_401_for_a_revoked_token(client: Client, alice: User) -> None:
    token = token_for("alice")
    services.token_revoke(prefix=token)
    assert Api(client, token).get("/api/approvals").status_code == 401


@pytest.mark.parametrize("via", ["token", "session"])
@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_it_answers_403_to_a_signed_in_non_reviewer(
    client: Client, dave: User, via: str, method: str, path: str, body: Any
) -> None:
    if via == "session":
        client.force_login(dave)
    response = _call(Api(client, token_for("dave") if via == "token" else None), method, path, body)
    assert response.status_code == 403
    assert response.json()["error_code"] == "forbidden"


def test_it_audits_a_non_reviewers_decision_attempt(client: Client, dave: User, paused: Run) -> None:
    approval = approval_of(paused)
    response = Api(client, token_for("dave")).post(f"/api/approvals/{approval.id}/decide", {"decision": "approved"})
    assert response.status_code == 403
    assert approval_of(paused).status == Approval.Status.PENDING
    assert audits(approval.id) == [("dave", "", "api", "not_permitted")]


def test_it_takes_the_browser_session_and_enforces_csrf_on_posts(alice: User, paused: Run) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    assert browser.get("/api/approvals").json()["count"] == 1  # reads need no token
    approval = approval_of(paused)
    url = f"/api/approvals/{approval.id}/decide"
    body = json.dumps({"decision": "approved", "auto_resume": False})
    refused = browser.post(url, body, content_type="application/json")
    assert (refused.status_code, refused.json()["error_code"]) == (403, "csrf_failed")
    assert approval_of(paused).status == Approval.Status.PENDING
    token = "t" * 32  # any 32-character secret: the cookie and the header must match
    browser.cookies["csrftoken"] = token
    accepted = browser.post(url, body, content_type="application/json", headers={"X-CSRFToken": token})
    assert accepted.status_code == 200
    assert audits(approval.id)[-1] == ("alice", "", "api", "decided")


def test_it_serves_its_openapi_schema_and_docs(client: Client, db: None) -> None:
    schema = client.get("/api/openapi.json").json()
    assert {"/api/runs", "/api/approvals/{approval_id}/decide", "/api/runs/{run_id}/events", "/api/events"} <= set(
        schema["paths"]
    )
    decide = schema["components"]["schemas"]["DecideIn"]
    assert decide["additionalProperties"] is False
    assert client.get("/api/docs").status_code == 200


def test_it_answers_exactly_what_the_cli_prints_as_json(
    api: Api, paused: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    from dashboard import cli

    approval = approval_of(paused)

    def printed(*argv: str) -> Any:
        assert cli.main([*argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    assert api.get(f"/api/runs/{paused.id}").json() == printed("runs", "show", paused.id)
    assert api.get(f"/api/approvals/{approval.id}").json() == printed("approvals", "show", approval.id)
    assert api.get("/api/runs").json()["items"] == printed("runs", "list")
    assert api.get("/api/approvals").json()["items"] == printed("approvals", "list")
