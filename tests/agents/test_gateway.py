"""The external-agent gate's services: policy outcomes, derived ids, exactly-once claims, in doubt."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from agents import cli, services
from agents.gateway import services as gateway
from agents.gateway.ids import approval_id as external_approval_id
from agents.gateway.selectors import external_call_get
from agents.models import Approval, AuditEntry, Run, RunEvent, ToolCall
from agents.services.deadlines import approval_deadline_fire
from agents.sweeper import sweep
from tests.support.flows import decide

POLICY = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money:
    rules:
      - {name: huge, when: "args.cents > 100000", action: deny, reason: "wires over 1,000.00 need a ticket"}
      - {name: small, when: "args.cents <= 1000", action: allow}
      - {name: large, when: "args.cents > 5000", action: ask, quorum: 2}
  delete_repo: {risk: high, hitl_mode: defer}
  refund_request: {risk: high}
"""


@pytest.fixture
def policy(agent_config: Any) -> None:
    agent_config(POLICY)


@pytest.fixture
def robot(db: None) -> str:
    user, _ = services.user_create(username="robot", role="agent")
    return user.username


def _gate(owner: str, call_id: str = "c1", tool: str = "wire_money", **arguments: Any) -> gateway.GateAnswer:
    request = gateway.GateRequest(agent="billing", session="s1", call_id=call_id, tool=tool, arguments=arguments)
    return gateway.gate_call(owner=owner, request=request)


def test_it_creates_an_agent_account_and_its_token_from_the_cli(db: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["users", "create", "ci-bot", "--role", "agent"]) == 0
    assert cli.main(["tokens", "create", "ci-bot"]) == 0
    user = User.objects.get(username="ci-bot")
    assert user.has_perm("agents.gate_external")
    assert not user.has_perm("agents.decide_approval")
    assert not user.has_perm("agents.view_approval")
    assert "af_" in capsys.readouterr().out


def test_it_asks_a_person_for_a_listed_tool_and_records_an_external_run(policy: None, robot: str) -> None:
    answer = _gate(robot, cents=2000)
    assert answer.decision == "pending"
    assert answer.approval_id == external_approval_id(owner=robot, agent="billing", session="s1", external_call_id="c1")
    approval = Approval.objects.select_related("run", "tool_call").get(pk=answer.approval_id)
    assert approval.run.kind == Run.Kind.EXTERNAL
    assert approval.run.created_by == robot
    assert approval.mode == Approval.Mode.SUSPEND
    assert approval.tool_call.status == ToolCall.Status.AWAITING_APPROVAL
    assert RunEvent.objects.filter(run=approval.run, type=RunEvent.Type.APPROVAL_REQUIRED).count() == 1


def test_it_asks_in_suspend_mode_even_when_the_tool_defers(policy: None, robot: str) -> None:
    answer = _gate(robot, tool="delete_repo", repo="x")
    assert Approval.objects.get(pk=answer.approval_id).mode == Approval.Mode.SUSPEND


def test_it_records_allow_and_deny_rules_as_policy_decisions(policy: None, robot: str) -> None:
    allowed = _gate(robot, "small", cents=500)
    denied = _gate(robot, "huge", cents=500_000)
    assert (allowed.decision, allowed.rule) == ("allowed", "small")
    assert (denied.decision, denied.rule, denied.reason) == ("denied", "huge", "wires over 1,000.00 need a ticket")
    assert Approval.objects.get(pk=allowed.approval_id).decided_by == "policy:small"
    assert Approval.objects.get(pk=denied.approval_id).status == Approval.Status.REJECTED
    audit = AuditEntry.objects.filter(approval_id__in=[allowed.approval_id, denied.approval_id])
    assert sorted(audit.values_list("actor", flat=True)) == ["policy:huge", "policy:small"]


def test_it_lets_a_rule_trust_the_account_where_the_agent_name_is_the_callers_say(
    agent_config: Any, robot: str
) -> None:
    agent_config(
        "tool_overrides:\n  wire_money:\n    rules:\n      - {name: billing bot, when: \"account == 'robot'\", action: allow}\n"
    )
    services.user_create(username="impostor", role="agent")

    assert _gate(robot, cents=2000).decision == "allowed"
    assert _gate("impostor", cents=2000).decision == "pending"  # it names itself "billing" too


def test_it_allows_an_unlisted_tool_without_asking(policy: None, robot: str) -> None:
    answer = _gate(robot, tool="read_file", path="/etc/motd")
    assert (answer.decision, answer.rule) == ("allowed", "")
    assert not Approval.objects.filter(pk=answer.approval_id).exists()
    assert gateway.external_call_claim(owner=robot, approval_id=answer.approval_id).claimed


def test_it_finds_the_same_approval_for_a_retried_request(policy: None, robot: str) -> None:
    first = _gate(robot, cents=2000)
    again = _gate(robot, cents=2000)
    assert again.approval_id == first.approval_id
    assert again.repeated
    assert ToolCall.objects.filter(run__kind=Run.Kind.EXTERNAL).count() == 1


def test_it_refuses_the_same_call_id_with_other_arguments(policy: None, robot: str) -> None:
    _gate(robot, cents=2000)
    with pytest.raises(gateway.Conflict) as refused:
        _gate(robot, cents=9000)
    assert refused.value.code == "arguments_changed"


def test_it_finds_the_same_call_and_result_for_a_retry_holding_a_large_float(policy: None, robot: str) -> None:
    # PostgreSQL's jsonb keeps 1e+23 as the integer 100000000000000000000000: still the same call.
    first = _gate(robot, "big", tool="measure", distance=1e23, ratio=0.1)
    again = _gate(robot, "big", tool="measure", distance=1e23, ratio=0.1)
    assert (again.approval_id, again.repeated) == (first.approval_id, True)
    assert gateway.external_call_claim(owner=robot, approval_id=first.approval_id).claimed
    report = {"owner": robot, "approval_id": first.approval_id, "ok": True, "result": {"mass": 6e24}}
    assert gateway.external_call_report(**report)[1]
    assert gateway.external_call_report(**report)[1] is False
    with pytest.raises(gateway.Conflict):
        gateway.external_call_report(**{**report, "result": {"mass": 6.1e24}})
    _gate(robot, "flag", tool="measure", on=1)
    with pytest.raises(gateway.Conflict):  # true is not 1, whatever Python's == says
        _gate(robot, "flag", tool="measure", on=True)


def test_it_hashes_a_call_id_that_is_not_url_safe(policy: None, robot: str) -> None:
    answer = _gate(robot, "call #1 / ünïcode", cents=10)
    assert answer.approval_id.startswith("appr_ext_")
    assert len(answer.approval_id) <= 200
    assert answer.approval_id.replace("_", "").replace("-", "").isalnum()


def test_it_refuses_arguments_that_cannot_be_stored(policy: None, robot: str) -> None:
    with pytest.raises(services.InvalidInput) as refused:
        _gate(robot, note="a\x00b")
    assert refused.value.details["field"] == "arguments"
    assert not Run.objects.exists()


def test_it_hides_another_accounts_calls(policy: None, robot: str) -> None:
    answer = _gate(robot, cents=2000)
    services.user_create(username="other", role="agent")
    with pytest.raises(services.NotFound):
        external_call_get(owner="other", approval_id=answer.approval_id)


def test_it_refuses_to_claim_a_pending_or_rejected_call(policy: None, robot: str, alice: Any, bob: Any) -> None:
    answer = _gate(robot, cents=2000)
    with pytest.raises(gateway.NotClaimable) as pending:
        gateway.external_call_claim(owner=robot, approval_id=answer.approval_id)
    assert pending.value.details["state"] == "pending"
    decide(answer.approval_id, "rejected", note="no")
    with pytest.raises(gateway.NotClaimable) as rejected:
        gateway.external_call_claim(owner=robot, approval_id=answer.approval_id)
    assert rejected.value.details["state"] == "rejected"


def test_it_hands_out_a_reviewers_edited_arguments(policy: None, robot: str, alice: Any) -> None:
    # A gated tool that a module also registers: the reviewer's edit is checked against its schema.
    answer = _gate(robot, "edit", tool="refund_request", order_id="A1001", amount_cents=2500)
    decide(answer.approval_id, "approved", arguments={"order_id": "A1001", "amount_cents": 1500})
    claim = gateway.external_call_claim(owner=robot, approval_id=answer.approval_id)
    assert (claim.claimed, claim.arguments) == (True, {"order_id": "A1001", "amount_cents": 1500})


def test_it_stores_a_result_once(policy: None, robot: str) -> None:
    answer = _gate(robot, "small", cents=500)
    gateway.external_call_claim(owner=robot, approval_id=answer.approval_id)
    outcome, stored = gateway.external_call_report(owner=robot, approval_id=answer.approval_id, ok=True, result=1)
    assert stored
    assert gateway.external_call_report(owner=robot, approval_id=answer.approval_id, ok=True, result=1) == (
        outcome,
        False,
    )
    with pytest.raises(gateway.Conflict):
        gateway.external_call_report(owner=robot, approval_id=answer.approval_id, ok=True, result=2)
    later = gateway.external_call_claim(owner=robot, approval_id=answer.approval_id)
    assert (later.claimed, later.state, later.result) == (False, "succeeded", {"ok": True, "result": 1})


def test_it_keeps_the_words_of_a_success_reported_with_an_error(policy: None, robot: str) -> None:
    answer = _gate(robot, "small", cents=500)
    gateway.external_call_claim(owner=robot, approval_id=answer.approval_id)
    report = {"ok": True, "result": {"sent": 3}, "error": "2 of 5 recipients bounced"}
    outcome, _ = gateway.external_call_report(owner=robot, approval_id=answer.approval_id, **report)

    assert outcome == report
    assert gateway.external_call_claim(owner=robot, approval_id=answer.approval_id).result == report


def test_it_refuses_a_result_before_the_claim(policy: None, robot: str) -> None:
    answer = _gate(robot, "small", cents=500)
    with pytest.raises(gateway.NotClaimable) as refused:
        gateway.external_call_report(owner=robot, approval_id=answer.approval_id, ok=True)
    assert refused.value.code == "not_claimed"


def test_it_refuses_a_new_call_in_a_cancelled_session(policy: None, robot: str, alice: Any) -> None:
    first = _gate(robot, "before", cents=2000)
    services.run_cancel(run_id=first.approval_id[len("appr_") : -len("_before")], attempt=_by_alice())
    with pytest.raises(gateway.NotClaimable) as refused:
        _gate(robot, "after", cents=2000)
    assert (refused.value.code, refused.value.details["state"]) == ("run_cancelled", "cancelled")
    assert not ToolCall.objects.filter(call_id="after").exists()
    assert not Approval.objects.filter(status=Approval.Status.PENDING).exists()


def test_it_answers_an_allowed_call_its_cancelled_session_stopped_as_expired(policy: None, robot: str) -> None:
    allowed = _gate(robot, "small", cents=500)
    unlisted = _gate(robot, "read", tool="read_file", path="/etc/motd")
    services.run_cancel(run_id=allowed.approval_id[len("appr_") : -len("_small")], attempt=_by_alice())
    for answer, arguments in ((allowed, {"cents": 500}), (unlisted, {"tool": "read_file", "path": "/etc/motd"})):
        again = _gate(robot, answer.approval_id.rsplit("_", 1)[1], **arguments)
        assert (again.decision, again.reason) == ("expired", "the run was cancelled")
        with pytest.raises(gateway.NotClaimable) as refused:
            gateway.external_call_claim(owner=robot, approval_id=answer.approval_id)
        assert (refused.value.code, refused.value.details["state"]) == ("run_cancelled", "expired")


def _by_alice() -> services.Attempt:
    return services.Attempt(actor="alice", source=AuditEntry.Source.API)


def test_it_marks_a_claim_with_no_result_in_doubt_after_the_lease(policy: None, robot: str, settings: Any) -> None:
    answer = _gate(robot, "small", cents=500)
    assert gateway.external_call_claim(owner=robot, approval_id=answer.approval_id).claimed
    settings.AGENTFAST_EXTERNAL_CLAIM_SECONDS = 3600
    assert sweep().in_doubt == []
    settings.AGENTFAST_EXTERNAL_CLAIM_SECONDS = 0
    [marked] = sweep().in_doubt
    assert ToolCall.objects.get(pk=marked).status == ToolCall.Status.IN_DOUBT
    again = gateway.external_call_claim(owner=robot, approval_id=answer.approval_id)
    assert (again.claimed, again.state) == (False, "in_doubt")


@pytest.mark.django_db(transaction=True)
def test_it_gives_exactly_one_of_32_concurrent_claims(policy: None, robot: str) -> None:
    answer = _gate(robot, "small", cents=500)
    start = threading.Barrier(32)
    claimed: list[bool] = []

    def claim() -> None:
        start.wait()
        try:
            claimed.append(gateway.external_call_claim(owner=robot, approval_id=answer.approval_id).claimed)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == [False] * 31 + [True]


def test_it_holds_a_scheduled_external_call_until_its_time_and_lets_one_due_run_at_once(
    agent_config: Any, robot: str
) -> None:
    agent_config(
        """
tool_overrides:
  wire_money:
    rules:
      - {name: later, when: "args.cents > 10", action: schedule, at: "now + duration('200ms')"}
      - {name: due, when: "args.cents <= 10", action: schedule, at: "now - duration('1h')"}
"""
    )
    assert _gate(robot, "due", cents=5).decision == "allowed"
    later = _gate(robot, "later", cents=2000)
    approval = Approval.objects.get(pk=later.approval_id)
    assert (later.decision, approval.on_timeout) == ("pending", Approval.OnTimeout.RUN)
    assert approval.expires_at is not None and approval.expires_at <= timezone.now() + timedelta(seconds=1)
    time.sleep(max(0.0, (approval.expires_at - timezone.now()).total_seconds()) + 0.01)

    assert approval_deadline_fire(approval_id=approval.id) == "run"
    assert gateway.external_call_claim(owner=robot, approval_id=later.approval_id).claimed
