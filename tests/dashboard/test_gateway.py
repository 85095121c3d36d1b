"""The external-agent gate over HTTP: tokens of each role, gate, wait, claim once, report, in doubt."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from agents import services
from agents.models import Approval, Run, ToolCall
from agents.sweeper import sweep
from tests.conftest import ROOT, child_env
from tests.support import flows
from tests.support.processes import Daphne

POLICY = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money:
    rules:
      - {name: huge, when: "args.cents > 100000", action: deny, reason: "wires over 1,000.00 need a ticket"}
      - {name: small, when: "args.cents <= 1000", action: allow}
"""


class Api:
    """A JSON client with a bearer token."""

    def __init__(self, client: Client, token: str) -> None:
        self.client, self.headers = client, {"Authorization": f"Bearer {token}"}

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(path, params, headers=self.headers)

    def post(self, path: str, body: Any = None) -> Any:
        data = "" if body is None else json.dumps(body)
        return self.client.post(path, data=data, content_type="application/json", headers=self.headers)


def _gate_body(call_id: str = "c1", **arguments: Any) -> dict[str, Any]:
    return {
        "agent": "billing",
        "session": "thread-7",
        "call_id": call_id,
        "tool": "wire_money",
        "arguments": arguments or {"cents": 2000},
        "description": "Wire money to a supplier",
        "metadata": {"ticket": "T-1"},
    }


@pytest.fixture
def policy(agent_config: Any) -> Path:
    return agent_config(POLICY)


@pytest.fixture
def robot(db: None, client: Client) -> Api:
    services.user_create(username="robot", role="agent")
    return Api(client, services.token_create(username="robot")[1])


@pytest.fixture
def reviewer(alice: User) -> Api:
    return Api(Client(), services.token_create(username="alice")[1])


def test_it_runs_the_whole_flow_with_a_token_of_each_role(policy: Path, robot: Api, reviewer: Api, carol: User) -> None:
    admin = Api(Client(), services.token_create(username="carol")[1])
    gated = robot.post("/api/gate", _gate_body())
    assert gated.status_code == 200, gated.content
    answer = gated.json()
    assert answer["decision"] == "pending"
    approval_id = answer["approval_id"]
    assert robot.post(f"/api/approvals/{approval_id}/decide", {"decision": "approved"}).status_code == 403
    assert robot.get("/api/approvals").status_code == 403
    assert robot.get(f"/api/approvals/{approval_id}").status_code == 403
    assert reviewer.post("/api/gate", _gate_body("c2")).status_code == 403
    assert admin.post("/api/gate", _gate_body("c3")).status_code == 403
    assert robot.post(f"/api/approvals/{approval_id}/claim").json()["error_code"] == "approval_pending"
    assert reviewer.get("/api/approvals").json()["items"][0]["id"] == approval_id  # in the inbox like any other
    decided = reviewer.post(f"/api/approvals/{approval_id}/decide", {"decision": "approved", "note": "ok"})
    assert decided.status_code == 200, decided.content
    assert robot.get(f"/api/approvals/{approval_id}/wait", timeout=5).json()["status"] == "approved"
    assert reviewer.post(f"/api/approvals/{approval_id}/claim").status_code == 403
    claim = robot.post(f"/api/approvals/{approval_id}/claim").json()
    assert claim == {
        "claimed": True,
        "state": "running",
        "arguments": {"cents": 2000},
        "idempotency_key": approval_id,
        "result": None,
    }
    assert robot.post(f"/api/approvals/{approval_id}/claim").json()["claimed"] is False
    reported = robot.post(f"/api/approvals/{approval_id}/result", {"ok": True, "result": {"wire": "W-9"}})
    assert reported.json() == {
        "approval_id": approval_id,
        "stored": True,
        "outcome": {"ok": True, "result": {"wire": "W-9"}},
    }
    again = robot.post(f"/api/approvals/{approval_id}/result", {"ok": True, "result": {"wire": "W-9"}})
    assert again.json()["stored"] is False
    other = robot.post(f"/api/approvals/{approval_id}/result", {"ok": False, "error": "bank down"})
    assert (other.status_code, other.json()["error_code"]) == (409, "result_conflict")
    later = robot.post(f"/api/approvals/{approval_id}/claim").json()
    assert (later["claimed"], later["state"], later["result"]) == (
        False,
        "succeeded",
        {"ok": True, "result": {"wire": "W-9"}},
    )
    run = reviewer.get(f"/api/runs/{Approval.objects.get(pk=approval_id).run_id}").json()
    assert run["tool_calls"][0]["status"] == "succeeded"


def test_it_shows_an_external_run_with_its_badge(policy: Path, robot: Api, alice: User, client_for: Any) -> None:
    robot.post("/api/gate", _gate_body())
    page = client_for(alice).get("/runs")
    assert b"kind-external" in page.content
    inbox = client_for(alice).get("/")
    assert b"kind-external" in inbox.content


def test_it_answers_a_retried_gate_with_the_same_approval(policy: Path, robot: Api) -> None:
    first = robot.post("/api/gate", _gate_body()).json()
    again = robot.post("/api/gate", _gate_body()).json()
    assert again == first
    changed = robot.post("/api/gate", _gate_body(cents=9000))
    assert (changed.status_code, changed.json()["error_code"]) == (409, "arguments_changed")


def test_it_answers_what_the_policy_says(policy: Path, robot: Api) -> None:
    allowed = robot.post("/api/gate", _gate_body("small", cents=500)).json()
    denied = robot.post("/api/gate", _gate_body("huge", cents=500_000)).json()
    asked = robot.post("/api/gate", _gate_body("mid", cents=3000)).json()
    unlisted = robot.post("/api/gate", {**_gate_body("read"), "tool": "read_file", "arguments": {"p": 1}}).json()
    assert (allowed["decision"], allowed["rule"]) == ("allowed", "small")
    assert (denied["decision"], denied["rule"], denied["reason"]) == (
        "denied",
        "huge",
        "wires over 1,000.00 need a ticket",
    )
    assert (asked["decision"], asked["rule"]) == ("pending", None)
    assert (unlisted["decision"], unlisted["rule"]) == ("allowed", None)
    refused = robot.post(f"/api/approvals/{denied['approval_id']}/claim")
    assert (refused.status_code, refused.json()["state"]) == (409, "denied")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"arguments": [1, 2]}, "arguments"),
        ({"arguments": {"note": "a\u0000b"}}, "arguments"),
        ({"tool": "two words"}, "tool"),
        ({"tool": "wire_money\n"}, "tool"),
        ({"session": ""}, "session"),
        ({"extra": 1}, "extra"),
        # Names shown to reviewers: invisible and direction characters would let one pass for another.
        ({"agent": "billing\u202e"}, "agent"),
        ({"agent": "bill\ning"}, "agent"),
        ({"session": "thread\u200b-7"}, "session"),
        ({"call_id": "c\u20601"}, "call_id"),
    ],
)
def test_it_refuses_a_gate_request_it_cannot_store(
    policy: Path, robot: Api, change: dict[str, Any], field: str
) -> None:
    refused = robot.post("/api/gate", {**_gate_body(), **change})
    assert refused.status_code == 400
    assert refused.json()["field"] == field
    assert not Run.objects.exists()


def test_it_keeps_a_reported_result_it_must_repair(policy: Path, robot: Api) -> None:
    approval_id = robot.post("/api/gate", _gate_body("small", cents=500)).json()["approval_id"]
    assert robot.post(f"/api/approvals/{approval_id}/claim").json()["claimed"] is True
    body = '{"ok": false, "error": "bad\\u0000byte", "result": {"ratio": NaN, "name": "a\\ud800b", "n": Infinity}}'
    path = f"/api/approvals/{approval_id}/result"

    reported = robot.client.post(path, data=body, content_type="application/json", headers=robot.headers)
    again = robot.client.post(path, data=body, content_type="application/json", headers=robot.headers)

    repaired = {"ok": False, "error": "bad\ufffdbyte", "result": {"ratio": None, "name": "a\ufffdb", "n": None}}
    assert reported.status_code == 200, reported.content
    assert (reported.json()["stored"], reported.json()["outcome"]) == (True, repaired)
    assert (again.status_code, again.json()["stored"]) == (200, False)
    assert ToolCall.objects.get(run__kind=Run.Kind.EXTERNAL).result == repaired


def test_it_keeps_a_long_error_report_shortened(policy: Path, robot: Api) -> None:
    # The call ran: an error longer than the stored limit is cut, never refused (and lost).
    approval_id = robot.post("/api/gate", _gate_body("small", cents=500)).json()["approval_id"]
    assert robot.post(f"/api/approvals/{approval_id}/claim").json()["claimed"] is True
    report = {"ok": False, "error": "Traceback " + "x" * 20_000}

    reported = robot.post(f"/api/approvals/{approval_id}/result", report)
    again = robot.post(f"/api/approvals/{approval_id}/result", report)

    assert reported.status_code == 200, reported.content
    stored = ToolCall.objects.get(run__kind=Run.Kind.EXTERNAL).result
    assert stored["error"].startswith("Traceback xxx")
    assert len(stored["error"]) <= 10_000
    assert (again.status_code, again.json()["stored"]) == (200, False)


def test_it_keeps_a_reported_result_that_names_a_key_twice_as_json_reads_it(policy: Path, robot: Api) -> None:
    # A person's request naming a key twice is refused (which did they mean?); a result
    # reports what already ran, so it is stored as JSON reads it: the last of the two.
    approval_id = robot.post("/api/gate", _gate_body("small", cents=500)).json()["approval_id"]
    assert robot.post(f"/api/approvals/{approval_id}/claim").json()["claimed"] is True
    body = '{"ok": true, "result": {"wire": "W-1", "detail": {"id": 1, "id": 2}, "wire": "W-9"}}'
    path = f"/api/approvals/{approval_id}/result"

    reported = robot.client.post(path, data=body, content_type="application/json", headers=robot.headers)
    gated_twice = robot.client.post(
        "/api/gate",
        data='{"agent": "billing", "agent": "other"}',
        content_type="application/json",
        headers=robot.headers,
    )

    assert reported.status_code == 200, reported.content
    assert ToolCall.objects.get(run__kind=Run.Kind.EXTERNAL).result == {
        "ok": True,
        "result": {"wire": "W-9", "detail": {"id": 2}},
    }
    assert (gated_twice.status_code, gated_twice.json()["error_code"]) == (400, "duplicate_key")


@pytest.mark.parametrize(
    ("result", "stored"),
    [
        pytest.param("[" * 5000 + "]" * 5000, "(nested too deep)", id="nested 5,000 deep"),
        pytest.param("1" * 5000, "1" * 5000, id="a number of 5,000 digits"),
    ],
)
def test_it_keeps_a_reported_result_pythons_json_reader_cannot_hold(
    policy: Path, robot: Api, result: str, stored: str
) -> None:
    # The call ran: a result too deep or too long a number for the reader is kept in a form it can hold.
    approval_id = robot.post("/api/gate", _gate_body("small", cents=500)).json()["approval_id"]
    assert robot.post(f"/api/approvals/{approval_id}/claim").json()["claimed"] is True
    body = '{"ok": true, "result": {"wire": "W-1", "detail": ' + result + "}}"
    path = f"/api/approvals/{approval_id}/result"

    reported = robot.client.post(path, data=body, content_type="application/json", headers=robot.headers)

    assert reported.status_code == 200, reported.content
    kept = ToolCall.objects.get(run__kind=Run.Kind.EXTERNAL).result
    assert kept["ok"] is True and kept["result"]["wire"] == "W-1"
    assert json.dumps(kept).count(stored) == 1


def test_it_hands_out_a_reviewers_edit_of_an_external_tool_nobody_registers(
    policy: Path, robot: Api, reviewer: Api, alice: User
) -> None:
    approval_id = robot.post("/api/gate", _gate_body("edit", cents=2000)).json()["approval_id"]
    page = Client()
    page.force_login(alice)
    assert "approving it will fail" not in page.get(f"/approvals/{approval_id}").content.decode()
    denied = reviewer.post(
        f"/api/approvals/{approval_id}/decide", {"decision": "approved", "arguments": {"cents": 200_000}}
    )
    assert (denied.status_code, denied.json()["field"]) == (403, "arguments")  # the policy still judges the edit
    decided = reviewer.post(
        f"/api/approvals/{approval_id}/decide", {"decision": "approved", "arguments": {"cents": 1500}}
    )
    assert decided.status_code == 200, decided.json()
    assert robot.get(f"/api/approvals/{approval_id}/wait", timeout=0).json()["edited"] is True
    claim = robot.post(f"/api/approvals/{approval_id}/claim").json()
    assert (claim["claimed"], claim["arguments"]) == (True, {"cents": 1500})


def test_it_decides_an_external_call_with_auto_resume_and_refuses_its_resume_as_the_wrong_state(
    policy: Path, robot: Api, reviewer: Api
) -> None:
    # Nobody drives an external session in agentfast, so nobody takes it from its agent: no 403.
    approval_id = robot.post("/api/gate", _gate_body("resume", cents=2000)).json()["approval_id"]
    decided = reviewer.post(f"/api/approvals/{approval_id}/decide", {"decision": "approved", "auto_resume": True})
    assert (decided.status_code, decided.json()["resume_enqueued"]) == (200, False)
    resumed = reviewer.post(f"/api/runs/{decided.json()['run_id']}/resume")
    assert (resumed.status_code, resumed.json()["error_code"]) == (422, "wrong_state")
    assert "external agent's session" in resumed.json()["message"]


def test_it_hides_another_agents_calls(policy: Path, robot: Api) -> None:
    approval_id = robot.post("/api/gate", _gate_body()).json()["approval_id"]
    services.user_create(username="spy", role="agent")
    spy = Api(Client(), services.token_create(username="spy")[1])
    assert spy.post(f"/api/approvals/{approval_id}/claim").status_code == 404
    assert spy.get(f"/api/approvals/{approval_id}/wait", timeout=0).status_code == 404


def test_it_answers_pending_at_the_wait_timeout(policy: Path, robot: Api) -> None:
    approval_id = robot.post("/api/gate", _gate_body()).json()["approval_id"]
    waited = robot.get(f"/api/approvals/{approval_id}/wait", timeout=0.2)
    assert waited.json() == {
        "approval_id": approval_id,
        "status": "pending",
        "decision": "pending",
        "decided_by": "",
        "note": "",
        "feedback": "",
        "payload": None,
        "edited": False,
    }
    assert robot.get(f"/api/approvals/{approval_id}/wait", timeout=61).status_code == 400


def test_it_hands_the_agent_every_word_a_reviewer_decided_with(policy: Path, robot: Api, reviewer: Api) -> None:
    rejected_id = robot.post("/api/gate", _gate_body("no", cents=2000)).json()["approval_id"]
    words = {"note": "not this supplier", "feedback": "wire it to ACME's second account"}
    assert reviewer.post(f"/api/approvals/{rejected_id}/decide", {"decision": "rejected", **words}).status_code == 200
    approved_id = robot.post("/api/gate", _gate_body("yes", cents=3000)).json()["approval_id"]
    answer = {"decision": "approved", "note": "fine", "payload": {"answer": "use the EUR account"}}
    assert reviewer.post(f"/api/approvals/{approved_id}/decide", answer).status_code == 200

    rejected = robot.get(f"/api/approvals/{rejected_id}/wait", timeout=0).json()
    approved = robot.get(f"/api/approvals/{approved_id}/wait", timeout=0).json()

    assert (rejected["note"], rejected["feedback"], rejected["payload"]) == (*words.values(), None)
    assert (approved["note"], approved["feedback"], approved["payload"]) == ("fine", "", answer["payload"])


def test_it_documents_the_gate_in_openapi(client: Client) -> None:
    paths = client.get("/api/openapi.json").json()["paths"]
    assert {"/api/gate", "/api/approvals/{approval_id}/wait", "/api/approvals/{approval_id}/claim"} <= set(paths)
    assert "409" in paths["/api/approvals/{approval_id}/result"]["post"]["responses"]


# -- against a live server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def live(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A daphne process on the test database, with the gate's policy; its URL."""
    where = tmp_path_factory.mktemp("gateway")
    (where / "agentfast.yaml").write_text(POLICY)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENTFAST_CONFIG", str(where / "agentfast.yaml"))
        server = Daphne(log=where / "daphne.log", env=child_env(AGENTFAST_CONFIG=str(where / "agentfast.yaml")))
        server.start()
        try:
            server.wait_ready()
            yield server.url
        finally:
            server.stop()


@pytest.fixture
def robot_token(transactional_db: None) -> str:
    services.user_create(username="robot", role="agent")
    return services.token_create(username="robot")[1]


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.integration
def test_it_wakes_a_waiting_client_when_a_reviewer_decides(live: str, robot_token: str, alice: User) -> None:
    approval_id = httpx.post(f"{live}/api/gate", json=_gate_body(), headers=_auth(robot_token)).json()["approval_id"]
    answers: list[dict[str, Any]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            httpx.get(
                f"{live}/api/approvals/{approval_id}/wait?timeout=60", headers=_auth(robot_token), timeout=70
            ).json()
        )
    )
    waiting.start()
    flows.decide(approval_id, "rejected", note="not this supplier")
    waiting.join(timeout=30)  # liveness only: the wait asked for 60 s, a decision must end it well before
    assert not waiting.is_alive()
    assert answers == [
        {
            "approval_id": approval_id,
            "status": "rejected",
            "decision": "rejected",
            "decided_by": "alice",
            "note": "not this supplier",
            "feedback": "",
            "payload": None,
            "edited": False,
        }
    ]


def _events(lines: Iterator[str], until: str) -> list[str]:
    """Read an SSE stream's lines up to the frame of event `until`; return the event names seen."""
    seen = []
    for line in lines:
        if line.startswith("event: "):
            seen.append(line.removeprefix("event: "))
            if seen[-1] == until:
                return seen
    raise AssertionError(f"the stream ended before {until}: {seen}")


@pytest.mark.integration
def test_it_streams_an_agent_its_own_sessions_events_until_its_token_is_revoked(
    live: str, robot_token: str, alice: User
) -> None:
    gated = httpx.post(f"{live}/api/gate", json=_gate_body("sse"), headers=_auth(robot_token)).json()
    events_url = f"{live}/api/runs/{gated['run_id']}/events"
    services.user_create(username="spy", role="agent")
    spy = services.token_create(username="spy")[1]
    assert httpx.get(events_url, headers=_auth(spy)).status_code == 404  # another account's session

    with httpx.stream("GET", events_url, headers=_auth(robot_token), timeout=30) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert "approval_required" in _events(lines, until="approval_required")
        flows.decide(gated["approval_id"], "approved", note="go ahead")
        assert _events(lines, until="approval_decided")[-1] == "approval_decided"
        services.token_revoke(prefix=robot_token.split("_")[1])
        assert [line for line in lines if line.startswith("event: ")] == ["event: access_ended"]  # and it ends


_CLAIM_AND_HANG = """
import sys, time, httpx
url, token, approval_id = sys.argv[1:]
answer = httpx.post(f"{url}/api/approvals/{approval_id}/claim", headers={"Authorization": f"Bearer {token}"}).json()
print(answer["claimed"], flush=True)
time.sleep(600)
"""


@pytest.mark.integration
def test_it_marks_a_killed_clients_claim_in_doubt_after_the_lease(live: str, robot_token: str, settings: Any) -> None:
    approval_id = httpx.post(
        f"{live}/api/gate", json=_gate_body("small", cents=500), headers=_auth(robot_token)
    ).json()["approval_id"]
    client = subprocess.Popen(
        [sys.executable, "-c", _CLAIM_AND_HANG, live, robot_token, approval_id], stdout=subprocess.PIPE, text=True
    )
    try:
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "True"
    finally:
        client.kill()
        client.wait(timeout=10)
    settings.AGENTFAST_EXTERNAL_CLAIM_SECONDS = 3600
    assert sweep().in_doubt == []  # still within its lease
    settings.AGENTFAST_EXTERNAL_CLAIM_SECONDS = 0
    assert len(sweep().in_doubt) == 1
    again = httpx.post(f"{live}/api/approvals/{approval_id}/claim", headers=_auth(robot_token)).json()
    assert (again["claimed"], again["state"]) == (False, "in_doubt")


# Processes, each with its own connection, released at once: more only load Django more often (~1 s of CPU each).
RACERS = 8
_CLAIM_AFTER_GO = """
import os, sys, time
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()
from agents.gateway.services import external_call_claim
go, owner, approval_id = sys.argv[1:]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
print(external_call_claim(owner=owner, approval_id=approval_id).claimed, flush=True)
"""


@pytest.mark.integration
@pytest.mark.skipif(connection.vendor != "postgresql", reason="processes racing on one row: PostgreSQL's row locks")
def test_it_gives_exactly_one_of_many_claiming_processes(robot_token: str, policy: Path, tmp_path: Path) -> None:
    api = Api(Client(), robot_token)
    approval_id = api.post("/api/gate", _gate_body("small", cents=500)).json()["approval_id"]
    go = tmp_path / "go"
    env = child_env(AGENTFAST_CONFIG=str(policy))
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIM_AFTER_GO, str(go), "robot", approval_id],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(RACERS)
    ]
    assert all(racer.stdout is not None and racer.stdout.readline().strip() == "ready" for racer in racers)
    go.touch()  # every racer has loaded Django and waits: they claim at once
    answers = [racer.communicate(timeout=120)[0].strip() for racer in racers]
    assert sorted(answers) == ["False"] * (RACERS - 1) + ["True"]
    assert ToolCall.objects.get(run__kind=Run.Kind.EXTERNAL).status == ToolCall.Status.RUNNING
