"""Untrusted text through the services: people's input is refused, models' and tools' output repaired.

Issue 7, items 2, 3, 15 and 17: every entry point (web, API, CLI, the driver) calls these
services, so what they refuse or repair is refused or repaired everywhere.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.test import Client

from agents import schemas, services, text
from agents.models import Approval, AuditEntry, Message, Run, RunEvent, SideEffect, ToolCall
from agents.tools import ToolContext, ToolError, registry
from tests.support.flows import decide, pending, resume, start, tool_outputs

REFUND = "Refund order A1001 for 25.00 USD"
QUESTION = "Ask a human whether to expedite order A1003"
LONE = "\ud800"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"note": f"ok{LONE}"}, "note"),
        ({"note": "ok\x00"}, "note"),
        ({"arguments": {"order_id": f"A1001{LONE}", "amount_cents": 100}}, "arguments"),
        ({"arguments": {"order_id": "A1001", "amount_cents": float("nan")}}, "arguments"),
        ({"payload": {"answer": LONE}}, "payload"),
    ],
    ids=["surrogate-note", "nul-note", "surrogate-arguments", "nan-arguments", "surrogate-payload"],
)
def test_it_refuses_a_reviewers_unstorable_text_naming_the_field_and_audits_it(db, fields, field):
    [approval] = pending(start(REFUND))

    with pytest.raises(services.InvalidInput) as refused:
        decide(approval, "approved", **fields)

    assert refused.value.details["field"] == field and field in refused.value.message
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.note == "" and approval.arguments is None
    [entry] = AuditEntry.objects.filter(approval_id=approval.id)
    assert entry.outcome == "invalid_arguments" and text.problem(entry.detail) is None


def test_it_refuses_feedback_with_a_rejection_only_when_it_cannot_be_stored(db):
    [approval] = pending(start(REFUND))

    with pytest.raises(services.InvalidInput, match="feedback"):
        decide(approval, "rejected", feedback=f"try{LONE}")


@pytest.mark.parametrize("prompt", [f"Refund {LONE}", "Refund\x00 A1001"], ids=["surrogate", "nul"])
def test_it_refuses_a_prompt_that_cannot_be_stored(db, prompt):
    with pytest.raises(services.InvalidInput) as refused:
        services.run_create(agent="support", input=prompt, enqueue=False)

    assert refused.value.details["field"] == "input"
    assert Run.objects.count() == 0


def test_it_audits_a_refused_attempt_with_every_field_cut_to_its_column(db):
    [approval] = pending(start(REFUND))
    attempt = services.Attempt(actor="x" * 400, source="web", origin="9" * 400 + LONE, on_behalf_of="y" * 400)

    with pytest.raises(services.NotFound):
        services.approval_decide(approval_id="appr_" + "z" * 300 + "\x00", decision="approved", attempt=attempt)
    with pytest.raises(services.InvalidInput):
        services.approval_decide(
            approval_id=approval.id, decision="approved", attempt=services.Attempt(actor=" ", source="api")
        )

    missing, blank = AuditEntry.objects.order_by("id")
    assert len(missing.approval_id) == 200 and len(missing.actor) == 150 and len(missing.origin) == 200
    assert text.problem([missing.approval_id, missing.origin]) is None
    assert blank.actor == "(anonymous)" and blank.outcome == "invalid_arguments"


# -- strict edits (item 15) -------------------------------------------------------------------


@pytest.mark.parametrize("amount", [True, "1500", 1000.0], ids=["bool", "string", "float"])
def test_it_refuses_edited_arguments_of_the_wrong_json_type(db, amount):
    [approval] = pending(start(REFUND))

    with pytest.raises(services.InvalidInput) as refused:
        decide(approval, "approved", arguments={"order_id": "A1001", "amount_cents": amount})

    assert refused.value.details["field"] == "arguments.amount_cents"
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert SideEffect.objects.count() == 0


def test_it_never_reads_a_models_boolean_as_a_number():
    refund = registry.get("refund_request")

    with pytest.raises(Exception, match="a boolean is not a number"):
        refund.validate({"order_id": "A1001", "amount_cents": True})
    assert refund.validate({"order_id": "A1001", "amount_cents": "1500"})["amount_cents"] == 1500


# -- never drop or invent a reviewer's words (item 17) ---------------------------------------------


def test_it_refuses_to_approve_with_feedback_rather_than_drop_it(db):
    [approval] = pending(start(REFUND))

    with pytest.raises(services.InvalidInput, match="feedback goes with a rejection") as refused:
        decide(approval, "approved", feedback="offer 10.00 instead")

    assert refused.value.details["field"] == "feedback"
    assert Approval.objects.get(pk=approval.pk).status == "pending"


@pytest.mark.parametrize(
    "fields", [{}, {"note": "sure"}, {"payload": {"answer": "  "}}], ids=["nothing", "note", "blank"]
)
def test_it_refuses_to_approve_a_question_without_an_answer(db, fields):
    [question] = pending(start(QUESTION))

    with pytest.raises(services.InvalidInput, match="asked a question"):
        decide(question, "approved", **fields)

    assert Approval.objects.get(pk=question.pk).status == "pending"


def test_it_tells_the_tool_the_reviewers_own_answer(db):
    run = start(QUESTION, auto_resume=False)
    [question] = pending(run)

    decide(question, "approved", payload={"answer": "no, wait a day"}, auto_resume=False)
    resume(run)

    assert tool_outputs(run)[-1]["result"]["answer"] == "no, wait a day"


def test_it_never_invents_an_answer_for_a_question_nobody_answered():
    ask_human = registry.get("ask_human")
    # A decision without an answer (e.g. a deadline's approval): the tool runs with no payload.
    ctx = ToolContext(
        run_id="run_1", tool_call_id="call_1", idempotency_key="k", approval_id="appr_1", approval_note="ok"
    )

    with pytest.raises(ToolError, match="Nobody answered"):
        ask_human(ctx, {"question": "Expedite order A1003?"})


# -- model and tool output is repaired, never refused ----------------------------------------------


def test_it_repairs_what_a_driver_stores_from_models_and_tools(db):
    run = start(REFUND, auto_resume=False)
    [approval] = pending(run)
    decide(approval, "approved", auto_resume=False)
    owner = "worker-1"
    assert services.run_lease(run_id=run.id, owner=owner) is not None
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    seq = Message.objects.filter(run=run).count() + 1

    services.toolcall_finish(
        owner=owner, tool_call=call, seq=seq, status="succeeded", output={"ok": True, "result": f"x{LONE}\x00"}
    )
    services.message_append(owner=owner, run_id=run.id, seq=seq + 1, role="system", content=f"note{LONE}")
    services.run_complete(run_id=run.id, owner=owner, seq=seq + 2, content=f"done{LONE}")

    call.refresh_from_db()
    run.refresh_from_db()
    stored = [call.result, run.output, *Message.objects.filter(run=run).values_list("content", flat=True)]
    stored += list(RunEvent.objects.filter(run=run).values_list("data", flat=True))
    assert text.problem(stored) is None
    assert call.result["result"] == "x\ufffd\ufffd" and run.output == "done\ufffd"


# -- rows written by older versions (the data migration) ---------------------------------------------


def test_it_repairs_rows_older_versions_stored(db, carol):
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's jsonb never held lone surrogates")
    run = start(REFUND)
    [approval] = pending(run)
    # Only an older version could store this, so the test writes it as that version did:
    # the JSON escape of a lone surrogate in a JSON column (SQLite keeps it as text).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE agents_toolcall SET arguments = %s WHERE id = %s",
            ['{"order_id": "A1001\\ud800", "amount_cents": 2500}', approval.tool_call_id],
        )
    client = Client()
    client.force_login(carol)
    for page in (
        "/",
        f"/approvals/{approval.id}",
        f"/runs/{run.id}",
        f"/admin/agents/toolcall/{approval.tool_call_id}/change/",
    ):
        assert client.get(page).status_code == 200, page  # shown repaired, before the migration too
    shape = schemas.ApprovalDetail.of(Approval.objects.select_related("tool_call").get(pk=approval.pk)).as_json()
    assert text.problem(shape) is None  # the API's and the CLI's JSON too
    migration: Any = importlib.import_module("agents.migrations.0003_repair_stored_text")

    migration.repair_stored_text(django_apps, None)

    assert ToolCall.objects.get(pk=approval.tool_call_id).arguments["order_id"] == "A1001\ufffd"
