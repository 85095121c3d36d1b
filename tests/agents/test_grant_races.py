"""A grant decides a call only if it is still live when the decision is recorded.

Each test commits a change on another connection in the window a race would hit: after the
grant lookup read the grant and its creator, before the call's decision is written. Django's
execute_wrapper finds that moment (the first statement after the lookup that is not a read),
so the race is exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from agents import services
from agents.models import Approval, AuditEntry, Grant, Run, SideEffect
from tests.support import flows
from tests.support.policies import support_yaml

HOUR = services.Remember(scope="exact", seconds=3600)
REFUND = "Refund order A1001 for 25.00 USD"
GATE_POLICY = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money: {risk: high}
"""


@contextmanager
def committed_after_the_grant_is_read(change: Callable[[], object]) -> Iterator[None]:
    """Commit `change` on another connection once the grant lookup is done, before the next write begins."""
    grants_read, changed = False, False
    failures: list[BaseException] = []

    def on_its_own_connection() -> None:
        try:
            change()
        except BaseException as exc:  # noqa: BLE001 — re-raised in the test's thread
            failures.append(exc)
        finally:
            connection.close()

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal grants_read, changed
        if grants_read and not changed and not sql.lstrip().startswith("SELECT"):
            changed = True
            other = threading.Thread(target=on_its_own_connection)
            other.start()
            other.join(timeout=30)
        if sql.lstrip().startswith("SELECT") and f"FROM {Grant._meta.db_table} g" in sql:
            grants_read = True
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield
    assert changed, "the grant lookup never read a grant"
    assert not failures, failures


def _revoke(grant: Grant) -> Callable[[], object]:
    return lambda: services.grant_revoke(grant_id=grant.id, actor=grant.created_by, source="cli")


def _expire(grant: Grant) -> Callable[[], object]:
    """Bring the grant's expiry forward to now: time passing, at the moment of the race."""
    return lambda: Grant.objects.filter(pk=grant.pk).update(expires_at=timezone.now() - timedelta(seconds=1))


def _remembered(decision: str, **fields: Any) -> Grant:
    run = flows.start(REFUND)
    [approval] = flows.pending(run)
    return flows.decide(approval, decision, remember=HOUR, **fields).grant


def _refund_of(run: Run) -> Approval:
    return Approval.objects.get(run=run, tool="refund_request")


def _grant_decided_nothing(grant: Grant) -> None:
    grant.refresh_from_db()
    assert grant.uses == 0 and grant.last_used_at is None
    assert not AuditEntry.objects.filter(actor=f"grant:{grant.id}").exists()


def test_it_asks_a_person_when_the_grant_is_revoked_before_the_call_is_recorded(transactional_db, alice, bob):
    grant = _remembered("approved")

    with committed_after_the_grant_is_read(_revoke(grant)):
        run = flows.start(REFUND)

    approval = _refund_of(run)
    assert run.status == Run.Status.SUSPENDED
    assert (approval.status, approval.decided_by) == (Approval.Status.PENDING, "")
    assert not SideEffect.objects.exists()  # no worker resumes the first run here: any refund is the second's
    _grant_decided_nothing(grant)


def test_it_asks_a_person_when_a_remembered_rejection_is_revoked_before_the_call_is_recorded(
    transactional_db, alice, bob
):
    grant = _remembered("rejected", note="not this one")

    with committed_after_the_grant_is_read(_revoke(grant)):
        run = flows.start(REFUND)

    assert (_refund_of(run).status, run.status) == (Approval.Status.PENDING, Run.Status.SUSPENDED)
    _grant_decided_nothing(grant)


def test_it_asks_a_person_when_the_grant_expires_before_the_call_is_recorded(transactional_db, alice, bob):
    grant = _remembered("approved")

    with committed_after_the_grant_is_read(_expire(grant)):
        run = flows.start(REFUND)

    assert _refund_of(run).status == Approval.Status.PENDING
    _grant_decided_nothing(grant)


def test_it_asks_a_person_when_the_grants_creator_is_deactivated_before_the_call_is_recorded(
    transactional_db, alice, bob
):
    grant = _remembered("approved")

    def deactivate() -> None:  # as the admin site does
        user = User.objects.get(username="alice")
        user.is_active = False
        user.save(update_fields=["is_active"])

    with committed_after_the_grant_is_read(deactivate):
        run = flows.start(REFUND)

    assert _refund_of(run).status == Approval.Status.PENDING
    _grant_decided_nothing(grant)


def test_it_asks_a_person_when_the_grants_creator_leaves_the_approvers_before_the_call_is_recorded(
    transactional_db, agent_config, alice, bob
):
    agent_config(support_yaml(approvers=["finance"]))
    services.user_set_groups(username="alice", groups=("finance",))
    grant = _remembered("approved")

    with committed_after_the_grant_is_read(lambda: services.user_set_groups(username="alice", groups=())):
        run = flows.start(REFUND)

    assert _refund_of(run).status == Approval.Status.PENDING
    _grant_decided_nothing(grant)


def test_it_still_lets_a_live_grant_decide_with_the_hook_in_place(transactional_db, alice, bob):
    grant = _remembered("approved")

    with committed_after_the_grant_is_read(lambda: None):
        run = flows.start(REFUND)

    assert (run.status, _refund_of(run).decided_by) == (Run.Status.COMPLETED, f"grant:{grant.id}")
    grant.refresh_from_db()
    assert grant.uses == 1


def _gate(owner: str, call_id: str) -> Any:
    from agents.gateway import services as gateway

    request = gateway.GateRequest(
        agent="billing", session="s1", call_id=call_id, tool="wire_money", arguments={"cents": 2000}
    )
    return gateway.gate_call(owner=owner, request=request)


@pytest.fixture
def robot(agent_config: Callable[[str], object], transactional_db: None) -> str:
    agent_config(GATE_POLICY)
    return services.user_create(username="robot", role="agent")[0].username


def test_it_leaves_an_external_call_pending_when_its_grant_is_revoked_before_the_gate_records_it(robot, alice):
    grant = flows.decide(_gate(robot, "c1").approval_id, "approved", remember=HOUR).grant

    with committed_after_the_grant_is_read(_revoke(grant)):
        answer = _gate(robot, "c2")

    assert answer.decision == "pending"
    approval = Approval.objects.get(pk=answer.approval_id)
    assert (approval.status, approval.decided_by) == (Approval.Status.PENDING, "")
    _grant_decided_nothing(grant)


def test_it_leaves_an_external_call_pending_when_its_grant_expires_before_the_gate_records_it(robot, alice):
    grant = flows.decide(_gate(robot, "c1").approval_id, "approved", remember=HOUR).grant

    with committed_after_the_grant_is_read(_expire(grant)):
        answer = _gate(robot, "c2")

    assert answer.decision == "pending"
    _grant_decided_nothing(grant)
