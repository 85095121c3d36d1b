"""The JSON API given requests a client may well send: HEAD, a query parameter twice, odd bodies."""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from django.contrib.auth.models import User
from django.http import StreamingHttpResponse
from django.test import Client

from agents.models import Approval, AuditEntry, Run
from tests.conftest import child_env
from tests.dashboard.test_api import REFUND, token_for
from tests.support import flows
from tests.support.processes import Daphne


@pytest.fixture
def bearer(alice: User) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_for('alice')}"}


@pytest.fixture
def paused(alice: User) -> Run:
    return flows.start(REFUND)


@pytest.mark.parametrize(
    "query",
    [
        "status=bogus&status=pending",
        "status=pending&status=all",
        "limit=1&limit=2",
        "agent=support&agent=other",
        "status=pending&status=pending",
    ],
)
def test_it_refuses_a_list_filter_given_twice_instead_of_keeping_the_last(
    client: Client, bearer: dict[str, str], paused: Run, query: str
) -> None:
    """`?status=a&status=b` read as `status=b` alone: a client asking for two got one, and no word of it."""
    response = client.get(f"/api/approvals?{query}", headers=bearer)

    assert response.status_code == 400
    body = response.json()
    name = query.partition("=")[0]
    assert (body["error_code"], body["field"]) == ("invalid", name)
    assert body["message"] == f"{name}: given more than once; give it once"


def test_it_refuses_a_repeated_parameter_of_a_stream_and_of_the_run_list(
    client: Client, bearer: dict[str, str], paused: Run
) -> None:
    runs = client.get("/api/runs?status=completed&status=suspended", headers=bearer)
    stream = client.get("/api/events?after=1&after=2", headers={**bearer, "Accept": "text/event-stream"})

    assert (runs.status_code, runs.json()["field"]) == (400, "status")
    assert (stream.status_code, stream.json()["field"]) == (400, "after")


def test_it_still_reads_parameters_given_once(client: Client, bearer: dict[str, str], paused: Run) -> None:
    response = client.get("/api/approvals?status=pending&agent=support&limit=5", headers=bearer)

    assert response.status_code == 200
    assert [row["id"] for row in response.json()["items"]] == [Approval.objects.get().id]


@pytest.mark.parametrize("path", ["/api/approvals", "/api/approvals/{id}", "/api/runs", "/api/runs/{run}"])
def test_it_answers_head_as_get_without_a_body(client: Client, bearer: dict[str, str], paused: Run, path: str) -> None:
    """HEAD must work wherever GET does (RFC 9110 9.1); it was a 405 on every endpoint."""
    path = path.replace("{id}", Approval.objects.get().id).replace("{run}", paused.id)
    got = client.get(path, headers=bearer)

    head = client.head(path, headers=bearer)

    assert head.status_code == 200
    assert head["Content-Type"] == got["Content-Type"]
    assert head["Content-Length"] == str(len(got.content))


def test_it_answers_head_with_the_status_get_would_have(client: Client, bearer: dict[str, str]) -> None:
    assert client.head("/api/approvals/appr_missing", headers=bearer).status_code == 404
    assert client.head("/api/approvals?limit=0", headers=bearer).status_code == 400
    assert client.head("/api/approvals").status_code == 401
    refused = client.head("/api/approvals/appr_x/decide", headers=bearer)
    assert (refused.status_code, refused["Allow"]) == (405, "POST")


def test_it_says_head_is_allowed_where_get_is(client: Client, bearer: dict[str, str]) -> None:
    response = client.put("/api/runs", headers=bearer)

    assert (response.status_code, response["Allow"]) == (405, "GET, HEAD, POST")


def test_it_answers_head_on_a_stream_without_holding_one_of_the_users_streams(
    client: Client, bearer: dict[str, str], paused: Run, settings
) -> None:
    settings.AGENTFAST_STREAMS_PER_USER = 2
    stream = {**bearer, "Accept": "text/event-stream"}
    for _ in range(5):
        for path in ("/api/events", f"/api/runs/{paused.id}/events"):
            head = client.head(path, headers=stream)
            assert head.status_code == 200
            assert head["Content-Type"].startswith("text/event-stream")
            body = cast(StreamingHttpResponse, head).streaming_content
            assert b"".join(cast(Iterable[bytes], body)) == b""  # as a server sends it: then it is closed

    opened = client.get("/api/events", headers=stream)  # a slot is still free: HEAD gave each back
    try:
        assert opened.status_code == 200
    finally:
        opened.close()


@pytest.mark.integration
def test_it_answers_head_over_a_real_server_with_headers_alone(
    transactional_db: None, alice: User, tmp_path: Path
) -> None:
    token = token_for("alice")
    headers = {"Authorization": f"Bearer {token}"}
    server = Daphne(log=tmp_path / "daphne.log", env=child_env(AGENTFAST_STREAMS_PER_USER="2"))
    server.start()
    try:
        server.wait_ready()
        got = httpx.get(f"{server.url}/api/approvals", headers=headers, timeout=10)
        head = httpx.head(f"{server.url}/api/approvals", headers=headers, timeout=10)
        assert (head.status_code, head.content, head.headers["content-length"]) == (
            200,
            b"",
            str(len(got.content)),
        )
        for _ in range(4):  # twice the streams alice may hold: each HEAD gave its slot back
            streamed = httpx.head(f"{server.url}/api/events", headers={**headers, "Accept": "text/event-stream"})
            assert (streamed.status_code, streamed.content) == (200, b"")
        with httpx.stream(
            "GET", f"{server.url}/api/events", headers={**headers, "Accept": "text/event-stream"}, timeout=10
        ) as opened:
            assert opened.status_code == 200
    finally:
        server.stop()


def _decide(client: Client, bearer: dict[str, str], approval_id: str, body: bytes, **headers: str) -> Any:
    return client.generic(
        "POST",
        f"/api/approvals/{approval_id}/decide",
        data=body,
        content_type=headers.pop("content_type", "application/json"),
        headers={**bearer, **headers},
    )


def test_it_refuses_a_compressed_body_saying_so_and_decides_nothing(
    client: Client, bearer: dict[str, str], paused: Run
) -> None:
    """A gzip body was refused as "malformed, or nested too deeply": true of its bytes, no help to its sender."""
    approval = Approval.objects.get()

    refused = _decide(client, bearer, approval.id, gzip.compress(b'{"decision": "rejected"}'), Content_Encoding="gzip")

    assert refused.status_code == 415
    assert refused.json() == {
        "error_code": "unsupported_media_type",
        "message": "the request body is 'gzip'-encoded: send it uncompressed",
    }
    assert refused["Accept-Encoding"] == "identity"
    assert Approval.objects.get().status == "pending"
    assert AuditEntry.objects.get().outcome == AuditEntry.Outcome.INVALID_ARGUMENTS


def test_it_refuses_a_body_that_is_not_utf8_saying_so(client: Client, bearer: dict[str, str], paused: Run) -> None:
    approval = Approval.objects.get()
    latin1 = '{"decision": "rejected", "note": "café"}'.encode("latin-1")

    refused = _decide(client, bearer, approval.id, latin1, content_type="application/json; charset=latin-1")

    assert refused.status_code == 400
    assert refused.json() == {
        "error_code": "malformed_json",
        "message": "the request body is not UTF-8 text: send JSON as UTF-8",
    }
    assert Approval.objects.get().status == "pending"


@pytest.mark.parametrize(
    "headers",
    [
        {"Content_Encoding": "identity"},
        {"content_type": "application/json; charset=utf-8"},
        {"content_type": "text/plain"},
    ],
)
def test_it_still_reads_a_plain_utf8_json_body(
    client: Client, bearer: dict[str, str], paused: Run, headers: dict[str, str]
) -> None:
    approval = Approval.objects.get()

    decided = _decide(client, bearer, approval.id, '{"decision": "rejected", "note": "café"}'.encode(), **headers)

    assert decided.status_code == 200
    assert Approval.objects.get().note == "café"
