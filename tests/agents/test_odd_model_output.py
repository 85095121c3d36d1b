"""Odd things a model endpoint or a tool hands the driver: each is told, refused or kept, never a crash.

Nothing of ours is mocked: the SDK, the driver and the database run for real against the
local OpenAI-compatible server (tests/support/fake_openai); only the model is a script.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from agents import services, text
from agents.models import Approval, Message, Run, SideEffect, ToolCall
from agents.runtime import drive
from agents.tools import ToolContext, feedback_required, tool
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCallSpec, tool_messages
from tests.support.flows import decide


@tool
def export_orders(ctx: ToolContext, customer: str) -> dict[str, Any]:
    """Export a customer's orders; answers with values JSON cannot hold (a sloppy tool)."""
    services.sideeffect_record(tool="export_orders", idempotency_key=ctx.idempotency_key, arguments={"c": customer})
    return {"at": dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.UTC), "digest": b"\x00\xff", "tags": {"vip"}}


@tool
def confirm_delivery(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Ask a person to confirm a delivery date first; the question holds a date (a sloppy tool)."""
    if ctx.approval_id is None:
        feedback_required({"order_id": order_id, "deliver_on": dt.date(2026, 1, 2)})
    services.sideeffect_record(tool="confirm_delivery", idempotency_key=ctx.idempotency_key, arguments={})
    return {"confirmed": order_id}


@pytest.fixture(autouse=True)
def _fast_failures(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """No SDK retries nor long waits: a failing endpoint fails the call at once."""
    settings.OPENAI_MAX_RETRIES = 0
    settings.OPENAI_TIMEOUT = 5
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAI) -> FakeOpenAI:
    """The `support` agent on the fake server, with a tool whose result JSON cannot hold."""
    config = {
        "agents": {
            "support": {
                "model": "openai:test-model",
                "base_url": fake_openai.base_url,
                "tools": ["lookup_order", "refund_request", "export_orders", "confirm_delivery"],
                "max_steps": 5,
            }
        },
        "tool_overrides": {"refund_request": {"risk": "high", "hitl_mode": "suspend"}},
    }
    path = tmp_path / "agentfast.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    monkeypatch.setenv("AGENTFAST_CONFIG", str(path))
    return fake_openai


def _start() -> str:
    return services.run_create(agent="support", input="Where is order A1001?", enqueue=False).id


def _calls_then_answer(*calls: ToolCallSpec) -> Callable[[dict[str, Any]], Reply]:
    def respond(body: dict[str, Any]) -> Reply:
        return Reply(content="Done.") if tool_messages(body) else Reply(tool_calls=list(calls))

    return respond


def _answer(message: dict[str, Any], finish_reason: str, *, stream: bool) -> Reply:
    """Return a reply sent as the endpoint's own JSON, whole or as one streamed chunk."""
    envelope = {"id": "chatcmpl-odd", "created": 0, "model": "test-model"}
    if stream:
        choice = {"index": 0, "delta": message, "finish_reason": finish_reason}
        return Reply(chunks=[{**envelope, "object": "chat.completion.chunk", "choices": [choice]}])
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}
    return Reply(body={**envelope, "object": "chat.completion", "choices": [choice]})


@pytest.mark.parametrize("depth", [40, 100_000], ids=["deeper-than-allowed", "past-the-recursion-limit"])
def test_it_tells_the_model_about_arguments_nested_too_deep_and_goes_on(db, model: FakeOpenAI, depth: int) -> None:  # noqa: ANN001
    arguments = '{"order_id": ' + "[" * depth + "]" * depth + "}"
    model.script(_calls_then_answer(("call_deep", "lookup_order", arguments)))
    run_id = _start()

    assert drive(run_id, stream=False).status == "completed"

    run = Run.objects.get(pk=run_id)
    assert run.output == "Done." and run.error == ""
    [told] = tool_messages(model.requests[1])
    assert told["content"]["error_code"] == "INVALID_ARGUMENTS"
    assert "nested deeper than" in told["content"]["message"]
    assert ToolCall.objects.get(run_id=run_id).status == ToolCall.Status.FAILED


def test_it_hands_the_tool_the_arguments_as_stored(db, model: FakeOpenAI) -> None:  # noqa: ANN001
    # A lone surrogate is repaired before the tool, the policy or a reviewer sees the call.
    model.script(_calls_then_answer(("call_odd", "export_orders", '{"customer": "c\\ud800"}')))
    run_id = _start()

    assert drive(run_id, stream=False).status == "completed"

    [effect] = SideEffect.objects.all()
    call = ToolCall.objects.get(run_id=run_id)
    assert effect.arguments == {"c": "c\ufffd"} == {"c": call.arguments["customer"]}
    assert call.executed_arguments == call.arguments


def test_it_keeps_a_tool_result_json_cannot_hold_as_text_and_runs_it_once(db, model: FakeOpenAI) -> None:  # noqa: ANN001
    model.script(_calls_then_answer(("call_export", "export_orders", '{"customer": "c1"}')))
    run_id = _start()

    assert drive(run_id, stream=False).status == "completed"

    run = Run.objects.get(pk=run_id)
    assert run.error == "" and run.output == "Done."
    call = ToolCall.objects.get(run_id=run_id)
    assert call.status == ToolCall.Status.SUCCEEDED
    assert call.result["result"] == {"at": "2026-01-02 03:04:00+00:00", "digest": "b'\\x00\\xff'", "tags": "{'vip'}"}
    [told] = tool_messages(model.requests[1])
    assert told["content"] == call.result  # the model read what was stored
    assert SideEffect.objects.count() == 1
    assert drive(run_id, stream=False).driven is False
    assert SideEffect.objects.count() == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("finish_reason", "why"),
    [("length", "token limit"), ("content_filter", "content filter")],
    ids=["length", "filter"],
)
def test_it_fails_the_run_when_the_endpoint_stopped_the_answer_early(
    db, model: FakeOpenAI, stream: bool, finish_reason: str, why: str
) -> None:  # noqa: ANN001
    model.script(lambda body: _answer({"content": "Your refund of the whole"}, finish_reason, stream=stream))
    run_id = _start()

    assert drive(run_id, stream=stream).status == "failed"

    run = Run.objects.get(pk=run_id)
    assert run.output == "" and why in run.error and "openai:test-model" in run.error
    assert "internal error" not in run.error
    assert list(Message.objects.filter(run_id=run_id).values_list("role", flat=True)) == ["user"]


def test_it_fails_the_run_rather_than_run_a_call_whose_arguments_were_cut(db, model: FakeOpenAI) -> None:  # noqa: ANN001
    call = {
        "id": "call_cut",
        "type": "function",
        "function": {"name": "lookup_order", "arguments": '{"order_id": "A10'},
    }
    model.script(lambda body: _answer({"content": None, "tool_calls": [call]}, "length", stream=False))
    run_id = _start()

    assert drive(run_id, stream=False).status == "failed"

    assert "token limit" in Run.objects.get(pk=run_id).error
    assert ToolCall.objects.count() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_it_keeps_a_models_refusal_as_its_answer(db, model: FakeOpenAI, stream: bool) -> None:  # noqa: ANN001
    refusal = "I can't help with that request."
    model.script(lambda body: _answer({"content": None, "refusal": refusal}, "stop", stream=stream))
    run_id = _start()

    assert drive(run_id, stream=stream).status == "completed"

    assert Run.objects.get(pk=run_id).output == refusal


def test_it_reads_a_refusal_sent_as_a_content_part(db, model: FakeOpenAI) -> None:  # noqa: ANN001
    parts = [{"type": "refusal", "refusal": "I can't help with that."}]
    model.script(lambda body: _answer({"content": parts}, "stop", stream=False))
    run_id = _start()

    assert drive(run_id, stream=False).status == "completed"

    assert Run.objects.get(pk=run_id).output == "I can't help with that."
    assert text.problem(Run.objects.get(pk=run_id).output) is None


def test_it_gives_a_call_a_fresh_id_when_the_one_it_would_make_was_proposed(db, model: FakeOpenAI) -> None:  # noqa: ANN001
    # The assistant turn is message 2: an unusable id becomes call_2_<place>, which the first call already took.
    model.script(
        _calls_then_answer(
            ("call_2_2", "lookup_order", '{"order_id": "A1001"}'),
            ("not a usable id!", "lookup_order", '{"order_id": "A1002"}'),
        )
    )
    run_id = _start()

    assert drive(run_id, stream=False).status == "completed"

    calls = dict(ToolCall.objects.filter(run_id=run_id).values_list("call_id", "arguments"))
    assert calls == {"call_2_2": {"order_id": "A1001"}, "call_2_2_2": {"order_id": "A1002"}}
    told = {m["tool_call_id"]: m["content"]["result"]["order_id"] for m in tool_messages(model.requests[1])}
    assert told == {"call_2_2": "A1001", "call_2_2_2": "A1002"}


def test_it_gives_a_call_whose_id_ends_in_a_newline_an_id_the_api_can_name(db, model: FakeOpenAI, alice) -> None:  # noqa: ANN001
    model.script(_calls_then_answer(("call_nl\n", "refund_request", '{"order_id": "A1001", "amount_cents": 2500}')))
    run_id = _start()

    assert drive(run_id, stream=False).status == "suspended"

    [approval] = Approval.objects.filter(run_id=run_id)
    assert approval.tool_call.call_id == "call_2_1"
    client = Client()
    client.force_login(alice)
    assert client.get(f"/api/approvals/{approval.id}").status_code == 200


def test_it_refuses_a_call_with_a_very_long_name_and_unreadable_arguments(db, model: FakeOpenAI) -> None:  # noqa: ANN001
    model.script(_calls_then_answer(("call_long", "x" * 1000, "{")))
    run_id = _start()

    assert drive(run_id, stream=False).status == "completed"

    call = ToolCall.objects.get(run_id=run_id)
    assert call.status == ToolCall.Status.FAILED and call.name == "x" * 100
    assert call.result["error_code"] == "INVALID_ARGUMENTS"


def test_it_asks_a_person_a_question_json_cannot_hold_and_runs_the_call_once_after(db, model: FakeOpenAI) -> None:  # noqa: ANN001
    model.script(_calls_then_answer(("call_confirm", "confirm_delivery", '{"order_id": "A1001"}')))
    run_id = _start()

    assert drive(run_id, stream=False).status == "suspended"

    [approval] = Approval.objects.filter(run_id=run_id)
    assert approval.status == "pending" and approval.request == {"order_id": "A1001", "deliver_on": "2026-01-02"}
    call = ToolCall.objects.get(run_id=run_id)
    assert call.executed_at is None and call.status == ToolCall.Status.AWAITING_APPROVAL  # not in doubt: it never ran
    decide(approval, "approved", payload={"deliver_on": "2026-01-02"}, auto_resume=False)
    assert drive(run_id, stream=False).status == "completed"
    assert ToolCall.objects.get(run_id=run_id).result["result"] == {"confirmed": "A1001"}
    assert SideEffect.objects.filter(tool="confirm_delivery").count() == 1
