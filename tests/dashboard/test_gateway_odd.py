"""The external-agent gate over HTTP, off the happy path: access ending mid-wait, odd ids and bodies, other accounts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Group, User
from django.test import AsyncClient, Client

from agents import services
from agents.models import Run, ToolCall
from tests.dashboard.test_gateway import POLICY, Api, _gate_body
from tests.support import flows

T = TypeVar("T")


async def in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await database_sync_to_async(func)(*args, **kwargs)


@pytest.fixture
def policy(agent_config: Any) -> Path:
    return agent_config(POLICY)


@pytest.fixture
def robot(db: None, client: Client) -> Api:
    services.user_create(username="robot", role="agent")
    return Api(client, services.token_create(username="robot")[1])


# -- a wait ends when the caller's access does ----------------------------------------------


def _deactivate(username: str) -> None:
    user = User.objects.get(username=username)
    user.is_active = False
    user.save()


def _drop_agent_role(username: str) -> None:
    User.objects.get(username=username).groups.remove(Group.objects.get(name="agent"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("end_access", "status", "code"),
    [
        (lambda secret: services.token_revoke(prefix=secret), 401, "unauthenticated"),
        (lambda secret: _deactivate("robot"), 401, "unauthenticated"),
        (lambda secret: _drop_agent_role("robot"), 403, "forbidden"),
    ],
    ids=["token revoked", "user deactivated", "agent role removed"],
)
async def test_it_ends_a_wait_when_the_callers_access_ends(
    agent_config: Any, end_access: Callable[[str], None], status: int, code: str
) -> None:
    agent_config(POLICY)
    await in_thread(services.user_create, username="robot", role="agent")
    secret = (await in_thread(services.token_create, username="robot"))[1]
    client, auth = AsyncClient(), {"Authorization": f"Bearer {secret}"}
    gated = await client.post("/api/gate", _gate_body(), content_type="application/json", headers=auth)
    assert gated.status_code == 200, gated.content
    approval_id = gated.json()["approval_id"]

    waiting = asyncio.ensure_future(client.get(f"/api/approvals/{approval_id}/wait", {"timeout": 60}, headers=auth))
    await asyncio.sleep(0.5)  # the wait is under way
    assert not waiting.done()
    await in_thread(end_access, secret)
    ended = await asyncio.wait_for(waiting, 5)  # asked for 60 s: it ends within a poll interval or two
    following = await client.get(f"/api/approvals/{approval_id}/wait", {"timeout": 0}, headers=auth)

    assert (ended.status_code, ended.json()["error_code"]) == (status, code)
    assert (following.status_code, following.json()["error_code"]) == (status, code)


@pytest.mark.django_db(transaction=True)
async def test_it_ends_a_reviewers_wait_when_their_sign_in_ends(agent_config: Any, alice: User) -> None:
    agent_config(POLICY)
    await in_thread(services.user_create, username="robot", role="agent")
    secret = (await in_thread(services.token_create, username="robot"))[1]
    gated = await AsyncClient().post(
        "/api/gate", _gate_body(), content_type="application/json", headers={"Authorization": f"Bearer {secret}"}
    )
    browser = AsyncClient()
    await browser.aforce_login(alice)

    waiting = asyncio.ensure_future(browser.get(f"/api/approvals/{gated.json()['approval_id']}/wait", {"timeout": 60}))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    await in_thread(services.user_set_password, username="alice", password="a new passphrase 7")  # signs her out
    ended = await asyncio.wait_for(waiting, 5)

    assert (ended.status_code, ended.json()["error_code"]) == (401, "unauthenticated")


# -- a wait says what a claim would find ----------------------------------------------------


def _cancel_the_session() -> None:
    run = Run.objects.get(kind=Run.Kind.EXTERNAL)
    services.run_cancel(run_id=run.id, attempt=services.Attempt(actor="carol", source="api"))


@pytest.mark.parametrize(
    "body",
    [_gate_body("small", cents=500), {**_gate_body("read"), "tool": "read_file"}],
    ids=["allowed by a rule", "unlisted"],
)
def test_it_answers_a_wait_on_an_allowed_call_of_a_cancelled_run_as_expired(
    policy: Path, robot: Api, carol: User, body: dict[str, Any]
) -> None:
    approval_id = robot.post("/api/gate", body).json()["approval_id"]
    _cancel_the_session()  # before the agent claimed the call

    waited = robot.get(f"/api/approvals/{approval_id}/wait", timeout=0).json()
    claimed = robot.post(f"/api/approvals/{approval_id}/claim").json()
    again = robot.post("/api/gate", body).json()

    assert (claimed["error_code"], claimed["state"]) == ("run_cancelled", "expired")
    assert again["decision"] == "expired"
    assert (waited["status"], waited["note"]) == ("expired", "the run was cancelled")


def test_it_says_denied_alike_in_the_gate_the_wait_and_the_claim_when_a_rule_refuses(policy: Path, robot: Api) -> None:
    gated = robot.post("/api/gate", _gate_body("c1", cents=200_000)).json()
    waited = robot.get(f"/api/approvals/{gated['approval_id']}/wait", timeout=0).json()
    claimed = robot.post(f"/api/approvals/{gated['approval_id']}/claim").json()

    assert gated["decision"] == "denied"
    assert (waited["decision"], waited["note"]) == ("denied", "wires over 1,000.00 need a ticket")
    assert (claimed["error_code"], claimed["state"]) == ("approval_denied", "denied")


def test_it_says_denied_alike_in_the_gate_the_wait_and_the_claim_when_a_standing_grant_refuses(
    policy: Path, robot: Api, alice: User
) -> None:
    first = robot.post("/api/gate", _gate_body("c1", cents=2000)).json()["approval_id"]
    flows.decide(first, "rejected", by="alice", note="never to ACME", remember=services.Remember.of("exact", 3600))
    gated = robot.post("/api/gate", _gate_body("c2", cents=2000)).json()
    waited = robot.get(f"/api/approvals/{gated['approval_id']}/wait", timeout=0).json()
    claimed = robot.post(f"/api/approvals/{gated['approval_id']}/claim").json()

    assert gated["decision"] == "denied"
    assert waited["decision"] == "denied" and waited["decided_by"].startswith("grant:")
    assert (claimed["error_code"], claimed["state"]) == ("approval_denied", "denied")


@pytest.mark.parametrize(("decision", "answer"), [("approved", "allowed"), ("rejected", "rejected")])
def test_it_says_in_the_wait_what_a_gate_would_answer_for_a_persons_decision(
    policy: Path, robot: Api, alice: User, decision: str, answer: str
) -> None:
    approval_id = robot.post("/api/gate", _gate_body("c1", cents=2000)).json()["approval_id"]
    assert robot.get(f"/api/approvals/{approval_id}/wait", timeout=0).json()["decision"] == "pending"
    flows.decide(approval_id, decision, by="alice")

    waited = robot.get(f"/api/approvals/{approval_id}/wait", timeout=0).json()
    again = robot.post("/api/gate", _gate_body("c1", cents=2000)).json()
    assert (waited["status"], waited["decision"]) == (decision, answer)
    assert again["decision"] == answer


# -- odd call ids ---------------------------------------------------------------------------


def test_it_keeps_a_call_id_that_looks_like_a_digest_apart_from_the_call_it_digests(policy: Path, robot: Api) -> None:
    odd = robot.post("/api/gate", _gate_body("../..", cents=500)).json()["approval_id"]
    look_alike = odd.rsplit("_", 2)[-2] + "_" + odd.rsplit("_", 1)[-1]  # "h_<40 hex>": a URL-safe call id
    assert look_alike.startswith("h_")
    other = robot.post("/api/gate", _gate_body(look_alike, cents=500)).json()["approval_id"]

    assert other != odd
    assert robot.post(f"/api/approvals/{odd}/claim").json()["claimed"] is True
    assert robot.post(f"/api/approvals/{other}/claim").json()["claimed"] is True  # another call: it runs too


def test_it_hides_another_accounts_call_from_every_gate_endpoint(policy: Path, robot: Api) -> None:
    approval_id = robot.post("/api/gate", _gate_body("small", cents=500)).json()["approval_id"]
    assert robot.post(f"/api/approvals/{approval_id}/claim").json()["claimed"] is True
    services.user_create(username="spy", role="agent")
    spy = Api(Client(), services.token_create(username="spy")[1])

    answers = [
        spy.get(f"/api/approvals/{approval_id}/wait", timeout=0),
        spy.post(f"/api/approvals/{approval_id}/claim"),
        spy.post(f"/api/approvals/{approval_id}/result", {"ok": False, "error": "forged"}),
    ]

    assert [(a.status_code, a.json()["error_code"]) for a in answers] == [(404, "not_found")] * 3
    assert ToolCall.objects.get(run__kind=Run.Kind.EXTERNAL).result is None
