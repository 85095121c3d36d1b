"""agents.sql, the services' raw statements, on the database the tests run on (SQLite, and Postgres in CI)."""

from __future__ import annotations

import threading
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from agents import events, services, sql
from agents.models import Approval, Grant, Message, Run, RunEvent, ToolCall
from tests.support.flows import decide, pending, start

REFUND = "Refund order A1001 for 25.00 USD"


def _queued() -> Run:
    return services.run_create(agent="support", input="Where is order A1001?", enqueue=False)


def test_it_leases_a_run_to_one_owner_and_returns_what_the_driver_needs(db):
    run = _queued()
    now = timezone.now()

    first = sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=now + timedelta(seconds=30))
    second = sql.run_lease(run_id=run.id, owner="w2", now=now, expires_at=now + timedelta(seconds=30))

    assert first is not None and first[:4] == ("support", 0, "Where is order A1001?", True)
    assert second is None
    run.refresh_from_db()
    assert (run.status, run.lease_owner) == (Run.Status.RUNNING, "w1")
    # Written raw, read by the ORM: the same datetime form.
    assert run.lease_expires_at == now + timedelta(seconds=30)


def test_it_takes_an_expired_lease_and_compares_it_with_orm_written_times(db):
    run = _queued()
    past = timezone.now() - timedelta(minutes=5)
    sql.run_lease(run_id=run.id, owner="w1", now=past, expires_at=past + timedelta(seconds=1))

    now = timezone.now()
    assert sql.run_lease(run_id=run.id, owner="w2", now=now, expires_at=now + timedelta(seconds=30)) is not None


def test_it_fences_a_drivers_write_by_its_lease(db):
    run = _queued()
    now = timezone.now()
    sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=now + timedelta(seconds=30))
    write = {"now": now, "lease_until": now + timedelta(seconds=30), "add_steps": 1, "fields": {"output": "x"}}

    first = sql.run_write(run_id=run.id, owner="w1", events=2, **write).run()
    assert first is not None and first.head == {"last_event_seq": 2}
    assert sql.run_write(run_id=run.id, owner="w2", events=1, **write).run() is None
    run.refresh_from_db()
    assert (run.steps, run.last_event_seq, run.output) == (1, 2, "x")


def test_it_suspends_only_a_run_that_still_waits_on_a_person(db):
    run = _queued()
    now = timezone.now()
    sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=now + timedelta(seconds=30))

    assert sql.run_suspend(run_id=run.id, owner="w1", now=now) is False  # nobody is asked anything


def test_it_leases_a_paused_run_only_once_its_approval_is_decided(db):
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)
    now = timezone.now()
    until = now + timedelta(seconds=30)

    assert sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=until) is None
    decide(approval, "approved", auto_resume=False)
    assert sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=until) is not None


def test_it_claims_a_call_once(db):
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)
    now = timezone.now()

    claims = [sql.toolcall_claim(tool_call_pk=approval.tool_call_id, now=now) for _ in range(3)]

    assert claims == [True, False, False]
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.status == ToolCall.Status.RUNNING and call.executed_at == now


def test_it_reads_a_tokens_user_with_permissions_and_whether_its_use_is_recorded(db):
    from django.contrib.auth.backends import ModelBackend
    from django.contrib.auth.models import Permission, User

    from agents.models import ApiToken
    from agents.services.tokens import _hash

    services.user_create(username="rita", role="reviewer")  # another user's permissions are not rico's
    rico = services.user_create(username="rico", role="reviewer")[0]
    rico.user_permissions.add(Permission.objects.get(codename="decide_on_behalf"))
    token = services.token_create(username="rico")[1]
    now = timezone.now()

    user, token_pk, stale = sql.token_user(token_hash=_hash(token), used_before=now)
    assert (user.username, stale) == ("rico", True)  # never used yet
    assert {"agents.decide_approval", "agents.decide_on_behalf"} <= user._perm_cache  # the group's and own
    assert user._perm_cache == ModelBackend().get_all_permissions(User.objects.get(pk=rico.pk))
    ApiToken.objects.filter(pk=token_pk).update(last_used_at=now)
    assert sql.token_user(token_hash=_hash(token), used_before=now - timedelta(seconds=1))[2] is False
    assert sql.token_user(token_hash=_hash(token), used_before=now + timedelta(seconds=1))[2] is True
    assert sql.token_user(token_hash=_hash(token + "x"), used_before=now) is None
    services.token_revoke(prefix=token)
    assert sql.token_user(token_hash=_hash(token), used_before=now) is None


def test_it_reads_an_approval_for_a_decision_as_the_orm_reads_it(db):
    from django.db import transaction
    from django.forms.models import model_to_dict

    from agents.models import Approval

    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)
    Approval.objects.filter(pk=approval.pk).update(payload={"answer": "yes", "n": [1, 2.5]}, approvers=["ops"])

    with transaction.atomic():
        found = sql.approval_for_decision(approval.pk)
    orm = Approval.objects.select_related("tool_call", "run").get(pk=approval.pk)

    assert found is not None and sql.approval_for_decision("appr_none") is None
    for ours, theirs in ((found, orm), (found.tool_call, orm.tool_call), (found.run, orm.run)):
        fields = [field.attname for field in type(theirs)._meta.concrete_fields]
        assert [getattr(ours, name) for name in fields] == [getattr(theirs, name) for name in fields]
        assert not ours._state.adding and ours._state.db == theirs._state.db
    assert found.payload == {"answer": "yes", "n": [1, 2.5]} and found.run.created_at.tzinfo is not None
    assert model_to_dict(found) == model_to_dict(orm)


def _fields(instance: object) -> list[object]:
    return [getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields]


def test_it_reads_a_runs_history_as_the_orm_reads_it(db, django_assert_num_queries):
    run = start("Refund order A1001 for 25.00 USD and look up order A1002", auto_resume=False)
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)

    messages, calls = sql.run_history(run.id, with_calls=True)

    assert [_fields(m) for m in messages] == [_fields(m) for m in Message.objects.filter(run=run).order_by("seq")]
    orm_calls = list(ToolCall.objects.filter(run=run).select_related("approval").order_by("step", "id"))
    assert [_fields(c) for c in calls] == [_fields(c) for c in orm_calls] and len(calls) >= 2
    with django_assert_num_queries(0):  # each call's approval, or its absence, was read with it
        approvals = {c.call_id: c.approval for c in calls if c.hitl_mode}
        assert [c.call_id for c in calls if not c.hitl_mode and not hasattr(c, "approval")]
    [(call_id, read)] = approvals.items()
    assert _fields(read) == _fields(Approval.objects.get(pk=approval.pk)) and read.tool_call.call_id == call_id
    assert not read._state.adding and messages[0].created_at.tzinfo is not None
    assert sql.run_history(run.id, with_calls=False) == (messages, [])


def test_it_reads_the_live_grants_of_a_call_rejections_first(db, alice):
    now = timezone.now()
    made = [
        Grant.objects.create(
            id=f"g{n}",
            created_by="alice",
            decision=decision,
            scope=scope,
            tool=tool,
            agent="support",
            arguments_digest=digest,
            expires_at=now + timedelta(hours=hours),
            revoked_at=revoked,
        )
        for n, (decision, scope, tool, digest, hours, revoked) in enumerate(
            [
                ("approved", "tool", "refund_request", "", 1, None),
                ("rejected", "exact", "refund_request", "d1", 1, None),
                ("approved", "exact", "refund_request", "d2", 1, None),  # other arguments
                ("approved", "tool", "refund_request", "", -1, None),  # expired
                ("approved", "tool", "refund_request", "", 1, now),  # revoked
                ("approved", "tool", "send_email", "", 1, None),  # another tool
            ]
        )
    ]

    internal = {"kind": "internal", "account": ""}
    found = sql.grants_for(tool="refund_request", agent="support", digest="d1", now=now, **internal)

    assert [g.id for g in found] == ["g1", "g0"]
    assert [_fields(g) for g in found] == [_fields(Grant.objects.get(pk=g.pk)) for g in (made[1], made[0])]
    assert sql.grants_for(tool="refund_request", agent="other", digest="d1", now=now, **internal) == []


def test_it_reads_only_the_grants_of_the_calls_principal(db, alice):
    now = timezone.now()
    for n, (kind, account) in enumerate([("internal", ""), ("external", "bot1"), ("external", "")]):
        Grant.objects.create(
            id=f"g{n}",
            created_by="alice",
            decision="approved",
            scope="tool",
            tool="wire_money",
            agent="billing",
            kind=kind,
            account=account,
            expires_at=now + timedelta(hours=1),
        )

    def found(kind: str, account: str) -> list[str]:
        grants = sql.grants_for(tool="wire_money", agent="billing", kind=kind, account=account, digest="d", now=now)
        return [g.id for g in grants]

    assert found("internal", "") == ["g0"]
    assert found("external", "bot1") == ["g1"]
    assert found("external", "bot2") == []


def _event(run: Run) -> int:
    with transaction.atomic():
        events.publish(run_id=run.id, type=RunEvent.Type.APPROVAL_REQUIRED, data={})
        return RunEvent.objects.filter(run=run).latest("pk").pk


def test_it_names_the_transactions_that_may_still_commit_an_event_id_below_the_newest(transactional_db):
    first, second = _queued(), _queued()
    newest = _event(first)
    assert sql.run_event_horizon() == (newest, frozenset())
    if connection.vendor != "postgresql":
        return  # SQLite: one writer at a time, whose ids come after every committed one
    inserted, release, held = threading.Event(), threading.Event(), []

    def hold() -> None:
        try:
            with transaction.atomic():
                held.append(_event(second))
                inserted.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inserted.wait(10)
        seen, holders = sql.run_event_horizon()
        assert seen == newest < held[0]  # the held id is not committed: only its transaction is named
        assert len(holders) == 1
    finally:
        release.set()
        holder.join(10)
    assert sql.run_event_horizon() == (held[0], frozenset())
