"""agents.sql.chain: a write of several rows hanging on one statement, on the database the tests run on.

On PostgreSQL a chain is one statement; on SQLite its statements run in a transaction. Either
way the rows must be those the ORM writes, all of them or none.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents import services, sql
from agents.models import Approval, Message, Run, RunEvent, ToolCall
from agents.sql.chain import Chain, HeadValue, InsertedValue, inserting, values_of

ODD = {"text": 'quote " backslash \\ newline \n tab \t emoji 😀 combining é', "n": [1, 2.5, None, True], "nested": {}}


def _leased() -> Run:
    run = services.run_create(agent="support", input="Where is order A1001?", enqueue=False)
    now = timezone.now()
    sql.run_lease(run_id=run.id, owner="w1", now=now, expires_at=now + timedelta(seconds=30))
    return run


def _write(run: Run, owner: str, *, events: int = 0) -> Chain:
    now = timezone.now()
    return sql.run_write(
        run_id=run.id,
        owner=owner,
        now=now,
        events=events,
        lease_until=now + timedelta(seconds=30),
        add_steps=0,
        fields={},
    )


def _messages(run: Run) -> list[tuple[int, str, str]]:
    return list(Message.objects.filter(run=run).order_by("seq").values_list("seq", "role", "content"))


def test_it_writes_the_rows_the_orm_would_write(db):
    run = _leased()
    chain = _write(run, "w1")
    chain.insert(Message, [{"run_id": run.id, "seq": 2, "role": "assistant", "content": "raw", "tool_calls": [ODD]}])
    chain.run()
    Message.objects.create(run=run, seq=3, role="assistant", content="orm", tool_calls=[ODD])

    raw, orm = Message.objects.filter(run=run, seq__in=[2, 3]).order_by("seq")
    for field in ("role", "tool_calls", "tool_call_id"):
        assert getattr(raw, field) == getattr(orm, field), field
    assert raw.tool_calls == [ODD]  # JSON goes in and comes back whole
    # auto_now_add was filled in at the write, in the form the ORM reads back
    assert timezone.now() - timedelta(seconds=5) < raw.created_at <= orm.created_at


def test_it_carries_every_kind_of_field_as_the_orm_writes_it(db):
    run = _leased()
    calls = [
        ToolCall.objects.create(run=run, call_id=f"c{n}", step=2, name="refund_request", status="a") for n in (1, 2)
    ]
    paris = timezone.get_fixed_timezone(60)
    values = {
        "run_id": run.id,
        "tool": "refund_request",
        "mode": Approval.Mode.SUSPEND,  # a choice, as the services pass it
        "request": ODD,
        "expires_at": timezone.now().astimezone(paris),  # another offset, microseconds
        "remind_every_seconds": 0.1,
        "four_eyes": True,
        "quorum": 2,
        "approvers": ["finance", "user:dan"],
        "escalate_to": [],
        "note": "",
    }
    chain = _write(run, "w1")
    chain.insert(Approval, [{**values, "id": "raw", "tool_call_id": calls[0].pk}])
    chain.run()
    Approval.objects.create(**values, id="orm", tool_call_id=calls[1].pk)

    raw, orm = Approval.objects.get(pk="raw"), Approval.objects.get(pk="orm")
    same = ("mode", "status", "request", "expires_at", "remind_every_seconds", "four_eyes", "quorum", "approvers")
    assert [getattr(raw, name) for name in same] == [getattr(orm, name) for name in same]
    assert (raw.on_timeout, raw.escalate_to, raw.decided_at, raw.payload) == ("reject", [], None, None)


def test_it_fills_in_field_defaults_and_keeps_given_values(db):
    run = _leased()
    call = ToolCall(run_id=run.id, call_id="c1", step=2, name="lookup_order", arguments=ODD, status="proposed")
    chain = _write(run, "w1")
    chain.insert(ToolCall, [values_of(call)])
    chain.run()

    stored = ToolCall.objects.get(run=run, call_id="c1")
    assert (stored.arguments, stored.hitl_mode, stored.result, stored.executed_at) == (ODD, "", None, None)


def test_it_writes_nothing_when_the_fence_refuses(db):
    run = _leased()
    chain = _write(run, "w2", events=1)  # w1 holds the lease
    chain.insert(Message, [{"run_id": run.id, "seq": 2, "role": "assistant", "content": "not mine"}])
    chain.update(Run, run.id, {"output": "not mine"})
    chain.insert(RunEvent, [{"run_id": run.id, "seq": HeadValue("last_event_seq"), "type": "message", "data": {}}])

    assert chain.run() is None

    run.refresh_from_db()
    assert (run.output, run.last_event_seq) == ("", 0)
    assert _messages(run) == [(1, "user", "Where is order A1001?")]
    assert not RunEvent.objects.filter(run=run).exists()


def test_it_gives_rows_the_values_the_head_returned(db):
    run = _leased()
    chain = _write(run, "w1", events=3)
    rows = [
        {"run_id": run.id, "seq": HeadValue("last_event_seq", 2 - n), "type": "message", "data": {"n": n}}
        for n in range(3)
    ]
    inserted = chain.insert(RunEvent, rows, returning=("id", "seq"))

    result = chain.run()

    assert result is not None and result.head == {"last_event_seq": 3}
    stored = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("id", "seq", "data"))
    assert [(seq, data) for _, seq, data in stored] == [(1, {"n": 0}), (2, {"n": 1}), (3, {"n": 2})]
    assert sorted(result.inserted[inserted]) == [(pk, seq) for pk, seq, _ in stored]


def test_it_links_a_row_to_one_an_earlier_insert_of_the_chain_made(db):
    run = _leased()
    chain = _write(run, "w1")
    calls = [
        ToolCall(run_id=run.id, call_id=call_id, step=2, name="refund_request", status="awaiting_approval")
        for call_id in ("c1", "c2")
    ]
    inserted = chain.insert(ToolCall, [values_of(c) for c in calls], returning=("id", "call_id"))
    approvals = [
        {
            "id": f"appr_{run.id}_{call_id}",
            "run_id": run.id,
            "tool_call_id": InsertedValue(inserted, "call_id", call_id),
            "tool": "refund_request",
            "mode": "suspend",
        }
        for call_id in ("c2", "c1")
    ]
    chain.insert(Approval, approvals)
    chain.insert(Message, [])  # nothing to add: no statement, no error

    chain.run()

    for call in ToolCall.objects.filter(run=run):
        assert call.approval.id == f"appr_{run.id}_{call.call_id}"
        assert (call.approval.status, call.approval.quorum, call.approval.approvers) == ("pending", 1, [])


def test_it_updates_a_row_only_while_it_holds_the_values_of_where(db):
    run = _leased()
    ToolCall.objects.create(run=run, call_id="c1", step=2, name="lookup_order", status="running")
    pk = ToolCall.objects.get(run=run).pk
    chain = _write(run, "w1")
    chain.update(ToolCall, pk, {"status": "succeeded", "result": ODD}, where={"executed_at": timezone.now()})
    chain.update(ToolCall, pk, {"reported_at": timezone.now()}, where={"executed_at": None})

    chain.run()

    stored = ToolCall.objects.get(pk=pk)
    assert (stored.status, stored.result) == ("running", None)  # where did not hold
    assert stored.reported_at is not None  # it did


def test_it_inserts_a_head_row_and_what_hangs_on_it(db):
    now = timezone.now()
    run = Run(id="run_chain_head", agent="support", input="hi", created_at=now, updated_at=now)
    chain = inserting(run, returning=("id",))
    chain.insert(Message, [{"run_id": run.id, "seq": 1, "role": "user", "content": "hi"}])

    result = chain.run()

    assert result is not None and result.head == {"id": "run_chain_head"}
    stored = Run.objects.get(pk="run_chain_head")
    assert (stored.status, stored.auto_resume, stored.created_at, stored.agent_config) == ("queued", True, now, None)
    assert _messages(stored) == [(1, "user", "hi")]


@pytest.mark.django_db(transaction=True)
def test_it_writes_all_or_nothing_when_a_row_is_refused():
    run = _leased()
    chain = _write(run, "w1", events=1)
    chain.update(Run, run.id, {"output": "half"})
    chain.insert(Message, [{"run_id": run.id, "seq": 1, "role": "assistant", "content": "a seq already taken"}])

    with pytest.raises(IntegrityError):
        chain.run()

    run.refresh_from_db()
    assert (run.output, run.last_event_seq, run.lease_owner) == ("", 0, "w1")
    assert _messages(run) == [(1, "user", "Where is order A1001?")]
    assert connection.in_atomic_block is False  # and the connection is usable again
    assert Run.objects.filter(pk=run.id).exists()


@pytest.mark.django_db(transaction=True)
def test_it_is_one_statement_on_postgresql_and_a_transaction_on_sqlite():
    run = _leased()
    chain = _write(run, "w1", events=1)
    chain.insert(Message, [{"run_id": run.id, "seq": 2, "role": "assistant", "content": "hello"}])
    chain.insert(RunEvent, [{"run_id": run.id, "seq": HeadValue("last_event_seq"), "type": "message", "data": {}}])

    with CaptureQueriesContext(connection) as queries:
        chain.run()

    statements = [q["sql"] for q in queries.captured_queries]
    expected = 1 if connection.vendor == "postgresql" else 3
    assert len([s for s in statements if s.split()[0] not in ("BEGIN", "COMMIT")]) == expected, statements


def test_it_rolls_back_with_the_callers_transaction(db):
    run = _leased()
    try:
        with transaction.atomic():
            chain = _write(run, "w1")
            chain.insert(Message, [{"run_id": run.id, "seq": 2, "role": "assistant", "content": "undone"}])
            chain.run()
            raise RuntimeError("the caller failed after the chain")
    except RuntimeError:
        pass

    assert _messages(run) == [(1, "user", "Where is order A1001?")]
