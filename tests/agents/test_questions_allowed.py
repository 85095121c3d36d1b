"""A tool's own question on a call a rule, a standing grant or a schedule let through reaches a person.

The rule (or grant, or the schedule's time, or a reviewer's Run now) decided that the call may run; nobody was asked, so nobody answered
what the tool asks (feedback_required). The call's one approval becomes the pending
question, for those the policy names; the answer comes from the web, the API or the CLI as
any other, and the tool runs once with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from agents import ids, services
from agents.cli import main as cli_main
from agents.models import Approval, AuditEntry, Grant, Run, RunEvent, SideEffect, ToolCall, Vote
from agents.services.deadlines import approval_deadline_fire
from tests.conftest import wait_for
from tests.support.fake_openai import Reply, tool_messages
from tests.support.flows import decide, pending, resume, start, tool_outputs

SHOP = """
agents:
  shop:
    model: "openai:test-model"
    base_url: "{base_url}"
    tools: [ship_order, pack_order, keep_asking, lookup_order]
tool_overrides:
  ship_order: {overrides}
  pack_order: {overrides}
  keep_asking: {overrides}
"""
RULES = """
    risk: high
    approvers: ["user:alice"]
    rules:
      - {name: hand orders, when: "args.order_id.startsWith('B')", action: deny, reason: "B orders ship by hand"}
      - {name: our orders, when: "args.order_id.startsWith('A')", action: allow}"""
GATED = "{risk: high}"
ANSWER = {"answer": "Monday"}


def order(tool: str, order_id: str = "A1003") -> Callable[[dict[str, Any]], Reply]:
    """Return a model script: call the tool for the order, then say what it answered."""

    def respond(body: dict[str, Any]) -> Reply:
        told = tool_messages(body)
        if not told:
            return Reply(tool_calls=[("call_1", tool, json.dumps({"order_id": order_id}))])
        return Reply(content=f"done: {told[-1]['content']}")

    return respond


@pytest.fixture
def shop(db, agent_config, fake_openai) -> Callable[..., None]:  # noqa: ANN001
    """Configure the shop agent's tools with these overrides, and the model to call `tool` once."""

    def configure(overrides: str, tool: str, order_id: str = "A1003") -> None:
        agent_config(SHOP.format(base_url=fake_openai.base_url, overrides=overrides))
        fake_openai.script(order(tool, order_id))

    return configure


def _audit(approval: Approval) -> list[tuple[str, str, str]]:
    entries = AuditEntry.objects.filter(approval_id=approval.id).order_by("id")
    return list(entries.values_list("actor", "action", "outcome"))


@pytest.mark.parametrize("tool", ["ship_order", "pack_order"])
def test_it_puts_the_question_of_a_call_a_rule_allowed_to_its_approvers_and_runs_it_once_answered(
    shop, alice: User, bob: User, tool: str
) -> None:
    shop(RULES, tool)

    run = start("ship A1003", agent="shop")

    assert run.status == Run.Status.SUSPENDED
    [approval] = pending(run)
    call = approval.tool_call
    assert approval.id == ids.approval_id(run.id, call.call_id)  # the call's one approval, now the question
    assert approval.request is not None and approval.request["answer"] == "text"
    assert (approval.mode, approval.decided_by, approval.decided_at, approval.rule) == ("suspend", "", None, "")
    assert approval.approvers == ["user:alice"]  # those the policy names for the call, as without the rule
    assert call.executed_at is None and call.status == ToolCall.Status.AWAITING_APPROVAL
    assert not SideEffect.objects.exists()
    asked = RunEvent.objects.get(run=run, type=RunEvent.Type.APPROVAL_REQUIRED)
    assert (asked.data["approval_id"], asked.data["request"]) == (approval.id, approval.request)
    assert "policy" not in asked.data  # the tool asks, not the rule
    assert _audit(approval) == [("policy:our orders", "approved", "decided"), ("system", "asked", "decided")]
    detail = AuditEntry.objects.get(approval_id=approval.id, action="asked").detail
    assert (detail["allowed_by"], detail["request"]) == ("policy:our orders", approval.request)

    with pytest.raises(services.NotPermitted):
        decide(approval, "approved", by="bob", payload=ANSWER)
    with pytest.raises(services.InvalidInput):
        decide(approval, "approved", by="alice")  # a question is approved with its answer
    decide(approval, "approved", by="alice", payload=ANSWER, auto_resume=False)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    [effect] = SideEffect.objects.all()
    assert (effect.tool, effect.idempotency_key, effect.arguments["answer"]) == (tool, approval.id, "Monday")
    assert tool_outputs(run)[-1]["result"] == {"order_id": "A1003", "answer": "Monday"}
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.payload) == ("approved", "alice", ANSWER)
    assert _audit(approval)[-1] == ("alice", "approved", "decided")


ASK_ALLOWED = """
agents:
  support: {model: demo, tools: [lookup_order, ask_human]}
tool_overrides:
  ask_human:
    rules:
      - {name: questions, when: "true", action: allow}
"""


def test_it_lets_ask_human_ask_under_an_allow_rule_and_takes_the_answer_from_the_api(
    db, agent_config, alice: User, client: Client
) -> None:
    agent_config(ASK_ALLOWED)
    run = start("Ask a human whether to expedite order A1003")
    [approval] = pending(run)
    headers = {"Authorization": f"Bearer {services.token_create(username='alice')[1]}"}

    shown = client.get(f"/api/approvals/{approval.id}", headers=headers).json()
    body = {"decision": "approved", "payload": {"answer": "yes, today"}, "auto_resume": False}
    decided = client.post(f"/api/approvals/{approval.id}/decide", body, "application/json", headers=headers)
    run = resume(run)

    assert (shown["status"], shown["request"]["question"]) == ("pending", "Should we expedite order A1003?")
    assert decided.status_code == 200, decided.content
    assert run.status == Run.Status.COMPLETED and run.output == "A person answered: yes, today"


def test_it_puts_the_question_of_a_call_a_grant_allowed_to_a_reviewer(shop, alice: User) -> None:
    shop(GATED, "ship_order")
    first = start("ship A1003", agent="shop")
    [asked] = pending(first)
    assert asked.request is None  # a gated call: the person's approval is the answer
    decide(asked, "approved", by="alice", remember=services.Remember(scope="exact", seconds=3600), auto_resume=False)
    assert resume(first).status == Run.Status.COMPLETED
    assert SideEffect.objects.get().arguments == {"order_id": "A1003", "answer": ""}

    run = start("ship A1003 again", agent="shop")

    grant = Grant.objects.get()
    assert run.status == Run.Status.SUSPENDED
    [approval] = pending(run)
    assert approval.request is not None and approval.decided_by == ""
    assert _audit(approval) == [(f"grant:{grant.id}", "approved", "decided"), ("system", "asked", "decided")]
    decide(approval, "approved", by="alice", payload=ANSWER, auto_resume=False)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    assert SideEffect.objects.get(idempotency_key=approval.id).arguments == {"order_id": "A1003", "answer": "Monday"}
    assert SideEffect.objects.count() == 2


def test_it_still_denies_a_call_a_deny_rule_matches_and_asks_nobody(shop, alice: User) -> None:
    shop(RULES, "ship_order", order_id="B7")

    run = start("ship B7", agent="shop")

    assert run.status == Run.Status.COMPLETED
    assert pending(run) == [] and not SideEffect.objects.exists()
    assert tool_outputs(run) == [{"ok": False, "error_code": "POLICY_DENIED", "message": "B orders ship by hand"}]


def test_it_asks_once_for_a_call_a_rule_allowed_and_fails_a_tool_that_asks_again(shop, alice: User) -> None:
    shop(RULES, "keep_asking")
    run = start("ask about A1003", agent="shop")
    [approval] = pending(run)

    decide(approval, "approved", by="alice", payload=ANSWER, auto_resume=False)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED  # the answer was given: nobody is asked a second time
    assert pending(run) == []
    output = tool_outputs(run)[-1]
    assert output["error_code"] == "TOOL_ERROR" and "asked for a decision again" in output["message"]
    assert ToolCall.objects.get(run=run).status == ToolCall.Status.FAILED


@pytest.mark.integration
def test_a_worker_asks_the_question_of_an_allowed_call_and_runs_it_once_answered_from_the_cli(
    shop, alice: User, start_worker, capsys
) -> None:
    shop(RULES, "ship_order")
    start_worker()
    run = services.run_create(agent="shop", input="ship A1003", created_by="bob")

    approval = wait_for(lambda: pending(run), what="the tool's question")[0]
    code = cli_main(["approvals", "approve", approval.id, "--by", "alice", "--answer", "Monday"])

    assert code == 0, capsys.readouterr()
    wait_for(lambda: Run.objects.get(pk=run.id).status == Run.Status.COMPLETED, what="the worker to resume the run")
    assert SideEffect.objects.get().arguments == {"order_id": "A1003", "answer": "Monday"}


SCHEDULED = """
    risk: high
    approvers: ["user:alice"]
    rules:
      - {name: tonight, when: "true", action: schedule, at: "now + duration('1h')"}"""


def _time_comes(held: Approval) -> None:
    Approval.objects.filter(pk=held.pk).update(expires_at=timezone.now() - timedelta(milliseconds=1))
    assert approval_deadline_fire(approval_id=held.id) == "run"  # the rule's time came: nobody was asked


def _run_now(held: Approval) -> None:
    # Run now is the call's time come early: the press lets it run, it answers no question.
    services.toolcall_run_now(approval_id=held.id, attempt=services.Attempt(actor="alice", source="web"))


@pytest.mark.parametrize("let_run", [_time_comes, _run_now], ids=["its time came", "run now"])
@pytest.mark.parametrize("tool", ["ship_order", "pack_order"])
def test_it_puts_the_question_of_a_scheduled_call_to_its_approvers_when_it_runs(
    shop, alice: User, tool: str, let_run: Callable[[Approval], None]
) -> None:
    shop(SCHEDULED, tool)
    run = start("ship A1003", agent="shop")
    [held] = pending(run)
    let_run(held)

    run = resume(run)

    assert run.status == Run.Status.SUSPENDED, "the tool's question was taken as answered by the clock or the press"
    [approval] = pending(run)
    assert approval.id == held.id and approval.request is not None
    assert (approval.decided_by, approval.approvers) == ("", ["user:alice"])
    assert ("system", "asked", "decided") in _audit(approval)
    assert not SideEffect.objects.exists()
    decide(approval, "approved", by="alice", payload=ANSWER, auto_resume=False)
    run = resume(run)
    assert run.status == Run.Status.COMPLETED
    [effect] = SideEffect.objects.all()
    assert (effect.tool, effect.arguments["answer"]) == (tool, "Monday")


def test_it_keeps_a_reviewers_rejection_of_a_scheduled_call_theirs_whatever_its_note(shop, alice: User) -> None:
    # Only Run now's approval lets a scheduled call run as its time would; a rejection typed
    # with the same words is a person's, which the gateway reports as rejected, not denied.
    shop(SCHEDULED, "ship_order")
    [held] = pending(start("ship A1003", agent="shop"))
    decide(held, "rejected", by="alice", note="run now", auto_resume=False)

    held.refresh_from_db()
    assert (held.status, held.decided_by, held.note) == (Approval.Status.REJECTED, "alice", "run now")
    assert not held.decided_by_policy


QUORUM = """
    risk: high
    approvers: ["user:alice", "user:bob"]
    quorum: 2
    rules:
      - {name: our orders, when: "args.order_id.startsWith('A')", action: allow}"""


def test_it_keeps_each_answer_of_a_question_two_people_must_answer(
    shop, alice: User, bob: User, capsys: pytest.CaptureFixture[str]
) -> None:
    # The tool gets the answer that completed the quorum; an earlier answer, or one changed, stays on record.
    shop(QUORUM, "ship_order")
    run = resume(start("ship A1003", agent="shop"))
    [question] = pending(run)
    assert question.request is not None and question.quorum == 2

    assert decide(question, "approved", by="alice", payload={"answer": "Monday"}, auto_resume=False).outcome == "voted"
    changed = decide(question, "approved", by="alice", payload={"answer": "Tuesday"}, auto_resume=False)
    assert changed.outcome == "voted", "alice's new answer was taken for the same vote again"
    client = Client()
    client.force_login(bob)
    shown = client.get(f"/api/approvals/{question.id}").json()["votes"]  # bob sees what alice answered
    assert [(vote["voter"], vote["payload"]) for vote in shown] == [("alice", {"answer": "Tuesday"})]
    for page in (f"/approvals/{question.id}", "/"):  # and on the approval page and the inbox card
        assert "Answered so far: alice: “Tuesday”" in client.get(page).content.decode(), page
    assert cli_main(["approvals", "show", question.id]) == 0  # and in the CLI
    assert "answered:    alice: Tuesday\n" in capsys.readouterr().out
    decide(question, "approved", by="bob", payload={"answer": "Wednesday"}, auto_resume=False)

    votes = AuditEntry.objects.filter(approval_id=question.id, action="approved", actor__in=["alice", "bob"])
    assert [(e.actor, e.outcome, e.detail.get("payload")) for e in votes.order_by("id")] == [
        ("alice", "voted", {"answer": "Monday"}),
        ("alice", "voted", {"answer": "Tuesday"}),
        ("bob", "decided", {"answer": "Wednesday"}),
    ]
    assert dict(question.votes.values_list("voter", "payload")) == {
        "alice": {"answer": "Tuesday"},
        "bob": {"answer": "Wednesday"},
    }
    assert resume(run).status == Run.Status.COMPLETED
    assert SideEffect.objects.get().arguments["answer"] == "Wednesday"


def test_it_shows_an_answer_without_an_answer_key_as_json(shop, alice: User, bob: User) -> None:
    shop(QUORUM, "ship_order")
    [question] = pending(resume(start("ship A1003", agent="shop")))
    decide(question, "approved", by="alice", payload={"answer": "Monday", "slot": 2}, auto_resume=False)
    Vote.objects.filter(approval=question, voter="alice").update(payload={"day": "Monday", "slot": [2, None]})

    assert question.answers_so_far == [("alice", '{"day": "Monday", "slot": [2, null]}')]
