"""Runs on the paths nobody walks: who may resume, odd runs, odd input, resumes and cancels out of turn."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents import services
from agents.gateway import services as gateway
from agents.models import Approval, AuditEntry, Run, RunEvent
from tests.support.flows import pending, start

REFUND = "Refund order A1001 for 25.00 USD"


def token_for(username: str) -> str:
    return services.token_create(username=username)[1]


def post(client: Client, username: str, path: str, body: Any = None, **headers: str) -> Any:
    data = "" if body is None else json.dumps(body)
    auth = {"Authorization": f"Bearer {token_for(username)}", **headers}
    return client.post(path, data=data, content_type="application/json", headers=auth)


def playground_run(by: str) -> Run:
    """Return a run as the playground leaves it: queued, auto_resume off, for its creator to drive."""
    return services.run_create(
        agent="support", input=REFUND, created_by=by, started_from="playground", auto_resume=False, enqueue=False
    )


# -- who may resume a run its creator drives --------------------------------------------


def test_it_refuses_and_audits_a_resume_of_someone_elses_run_with_auto_resume_off(
    client: Client, alice: User, bob: User, django_capture_on_commit_callbacks: Any
) -> None:
    run = playground_run("alice")
    with django_capture_on_commit_callbacks() as callbacks:
        response = post(client, "bob", f"/api/runs/{run.id}/resume")
    assert response.status_code == 403
    body = response.json()
    assert body["error_code"] == "not_permitted"
    assert "alice" in body["message"]
    assert callbacks == []  # nothing enqueued
    run.refresh_from_db()
    assert (run.status, run.lease_owner) == (Run.Status.QUEUED, "")
    entry = AuditEntry.objects.get(run_id=run.id)
    assert (entry.action, entry.actor, entry.outcome) == ("resume", "bob", AuditEntry.Outcome.NOT_PERMITTED)


def test_it_refuses_a_streamed_resume_of_someone_elses_run_without_driving_it(
    client: Client, alice: User, bob: User
) -> None:
    run = playground_run("alice")
    response = post(client, "bob", f"/api/runs/{run.id}/resume", Accept="text/event-stream")
    assert response.status_code == 403
    run.refresh_from_db()
    assert (run.status, run.steps) == (Run.Status.QUEUED, 0)


@pytest.mark.parametrize("who", ["alice", "carol"])
def test_it_lets_the_creator_or_an_admin_resume_a_run_with_auto_resume_off(
    client: Client, alice: User, carol: User, who: str, django_capture_on_commit_callbacks: Any
) -> None:
    run = playground_run("alice")
    with django_capture_on_commit_callbacks() as callbacks:
        response = post(client, who, f"/api/runs/{run.id}/resume")
    assert response.status_code == 200
    assert len(callbacks) == 1


def test_it_lets_anyone_resume_a_run_that_resumes_by_itself(
    client: Client, alice: User, bob: User, django_capture_on_commit_callbacks: Any
) -> None:
    run = services.run_create(agent="support", input=REFUND, created_by="alice", enqueue=False)
    with django_capture_on_commit_callbacks() as callbacks:
        response = post(client, "bob", f"/api/runs/{run.id}/resume")
    assert response.status_code == 200
    assert len(callbacks) == 1


def decide_over_api(client: Client, username: str, approval_id: str, **body: Any) -> Any:
    return post(client, username, f"/api/approvals/{approval_id}/decide", {"decision": "approved", **body})


def test_it_refuses_a_decision_that_would_resume_someone_elses_run_with_auto_resume_off(
    client: Client, alice: User, bob: User, django_capture_on_commit_callbacks: Any
) -> None:
    [approval] = pending(start(REFUND, auto_resume=False))  # bob's run, to drive himself
    with django_capture_on_commit_callbacks() as callbacks:
        response = decide_over_api(client, "alice", approval.id, auto_resume=True)
    assert response.status_code == 403
    body = response.json()
    assert (body["error_code"], body.get("field")) == ("not_permitted", "auto_resume")
    assert "bob" in body["message"]
    assert callbacks == []
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING  # the decision is not half made
    entry = AuditEntry.objects.get(approval_id=approval.id)
    assert (entry.actor, entry.outcome) == ("alice", AuditEntry.Outcome.NOT_PERMITTED)


def test_it_takes_a_decision_that_leaves_someone_elses_run_to_its_creator(
    client: Client, alice: User, bob: User
) -> None:
    [approval] = pending(start(REFUND, auto_resume=False))
    response = decide_over_api(client, "alice", approval.id)
    assert response.status_code == 200
    assert response.json()["resume_enqueued"] is False  # bob resumes it himself


@pytest.mark.parametrize("who", ["bob", "carol"])
def test_it_lets_the_creator_or_an_admin_decide_and_resume_a_run_with_auto_resume_off(
    client: Client, bob: User, carol: User, who: str
) -> None:
    [approval] = pending(start(REFUND, auto_resume=False))
    response = decide_over_api(client, who, approval.id, auto_resume=True)
    assert response.status_code == 200
    assert response.json()["resume_enqueued"] is True


# -- external runs are driven by their agent, never by a worker -------------------------


def test_it_refuses_to_resume_an_external_agents_session(
    client: Client, carol: User, agent_config: Any, django_capture_on_commit_callbacks: Any
) -> None:
    agent_config("tool_overrides:\n  refund_request: {risk: high}\n")
    services.user_create(username="robot", role="agent")
    request = gateway.GateRequest(agent="support", session="s1", call_id="c1", tool="lookup_order", arguments={})
    gateway.gate_call(owner="robot", request=request)
    run = Run.objects.get(kind=Run.Kind.EXTERNAL)
    with django_capture_on_commit_callbacks() as callbacks:
        response = post(client, "carol", f"/api/runs/{run.id}/resume")
    assert response.status_code == 422
    assert response.json()["error_code"] == "wrong_state"
    assert callbacks == []
    run.refresh_from_db()
    assert (run.status, run.lease_owner) == (Run.Status.RUNNING, "")


def test_it_never_drives_an_external_agents_session_from_the_cli(db: None, agent_config: Any) -> None:
    agent_config("tool_overrides:\n  refund_request: {risk: high}\n")
    services.user_create(username="robot", role="agent")
    request = gateway.GateRequest(agent="support", session="s1", call_id="c1", tool="lookup_order", arguments={})
    gateway.gate_call(owner="robot", request=request)
    run = Run.objects.get(kind=Run.Kind.EXTERNAL)
    with pytest.raises(services.WrongState, match="external"):
        services.run_request_resume(run_id=run.id, enqueue=False)


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_it_leaves_a_playground_run_opened_from_someone_elses_link_to_its_creator(alice: User, bob: User) -> None:
    """Bob opens alice's `/playground/?run=` link: the page shows the run, but his page's resume is refused."""
    created = signed_in(alice).post("/playground/runs", {"agent": "support", "input": REFUND}).json()
    run_id = created["run"]["id"]
    viewer = signed_in(bob)
    assert f'data-run-id="{run_id}"' in viewer.get(f"/playground/?run={run_id}").content.decode()
    response = viewer.post(f"/api/runs/{run_id}/resume?after=0", headers={"Accept": "text/event-stream"})
    assert response.status_code == 403
    assert Run.objects.get(pk=run_id).status == Run.Status.QUEUED
    assert signed_in(alice).post(f"/api/runs/{run_id}/resume?after=0").status_code == 200


# -- a failed run retried ---------------------------------------------------------------


def failed_run() -> Run:
    run = services.run_create(agent="support", input=REFUND, created_by="alice", enqueue=False)
    assert services.run_lease(run_id=run.id, owner="worker-1") is not None
    services.run_fail(run_id=run.id, owner="worker-1", error="the model endpoint is down")
    return run


def statuses(run: Run) -> list[str]:
    events = RunEvent.objects.filter(run_id=run.id, type=RunEvent.Type.RUN_STATUS).order_by("seq")
    return [event.data["status"] for event in events]


def test_it_records_the_retry_of_a_failed_run_so_its_events_do_not_end_at_the_failure(db: None) -> None:
    """A viewer replaying the events must not read the old `failed` as the run's last word."""
    run = failed_run()
    services.run_request_resume(run_id=run.id, enqueue=False)
    run.refresh_from_db()
    assert (run.status, run.error) == (Run.Status.QUEUED, "")
    assert statuses(run) == ["failed", "queued"]
    last = RunEvent.objects.filter(run_id=run.id).order_by("-seq").first()
    assert last is not None and last.seq == run.last_event_seq


def test_it_retries_a_failed_run_once_when_two_resumes_race_in(db: None) -> None:
    run = failed_run()
    services.run_request_resume(run_id=run.id, enqueue=False)
    services.run_request_resume(run_id=run.id, enqueue=False)  # the second finds it queued: nothing to record
    assert statuses(run) == ["failed", "queued"]
