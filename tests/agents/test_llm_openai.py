"""The `openai` provider against a real local OpenAI-compatible server (tests/support/fake_openai).

Nothing of ours is mocked: the SDK, its HTTP client and SSE parser, the driver and the
database all run for real; only the model behind the endpoint is a script.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer

from agents import events, services
from agents.llm import ModelError, get_model
from agents.llm.openai import MAX_CALLS_PER_TURN, OpenAIModel
from agents.models import Approval, Message, Run, SideEffect, ToolCall
from agents.runtime import drive
from agents.runtime.driver import _Deltas
from tests.support.fake_openai import FakeOpenAI, Reply, text_pieces, tool_messages

ROOT = Path(__file__).resolve().parents[2]
USER = [{"role": "user", "content": "Where is order A1001?"}]
LOOKUP_SPEC = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
}


@pytest.fixture(autouse=True)
def _fast_failures(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """No SDK retries nor long waits: a failing endpoint fails the call at once."""
    settings.OPENAI_MAX_RETRIES = 0
    settings.OPENAI_TIMEOUT = 5
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def _model(server: FakeOpenAI) -> OpenAIModel:
    return OpenAIModel("test-model", base_url=server.base_url)


# -- the provider alone ----------------------------------------------------------------


def test_it_returns_the_text_of_a_plain_answer(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(lambda body: Reply(content="Order A1001 was delivered."))

    turn = _model(fake_openai).complete(USER, [])

    assert turn.content == "Order A1001 was delivered."
    assert turn.tool_calls == []
    [request] = fake_openai.requests
    assert request["model"] == "test-model"
    assert request["messages"] == USER
    assert "tools" not in request  # an empty tool list is left out, as endpoints require
    assert not request.get("stream")


def test_it_is_chosen_by_get_model_with_the_agents_base_url(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(lambda body: Reply(content="hi"))

    model = get_model("openai:test-model", base_url=fake_openai.base_url)

    assert model.name == "openai:test-model"
    assert model.complete(USER, []).content == "hi"
    assert fake_openai.requests[0]["model"] == "test-model"


def test_it_returns_tool_calls_with_the_raw_argument_text(fake_openai: FakeOpenAI) -> None:
    spaced = '{ "order_id" :  "A1001" }'
    broken = '{"order_id": "A1002"'
    fake_openai.script(
        lambda body: Reply(tool_calls=[("call_a", "lookup_order", spaced), ("call_b", "lookup_order", broken)])
    )

    turn = _model(fake_openai).complete(USER, [LOOKUP_SPEC])

    assert turn.content == ""
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_a", "lookup_order", spaced),  # not re-serialized
        ("call_b", "lookup_order", broken),  # not parsed, so not a crash
    ]
    assert fake_openai.requests[0]["tools"] == [LOOKUP_SPEC]


def test_it_streams_text_pieces_in_order_to_on_delta(fake_openai: FakeOpenAI) -> None:
    answer = "Order A1001 was delivered on Monday, to the front door."
    fake_openai.script(lambda body: Reply(content=answer))
    pieces: list[str] = []

    turn = _model(fake_openai).complete(USER, [], on_delta=pieces.append)

    assert fake_openai.requests[0]["stream"] is True
    assert pieces == text_pieces(answer)
    assert len(pieces) > 5  # really streamed, not one chunk
    assert turn.content == answer


@pytest.mark.parametrize("interleave", [False, True], ids=["in-turn", "interleaved"])
def test_it_joins_streamed_tool_call_fragments_by_index(fake_openai: FakeOpenAI, interleave: bool) -> None:
    first = json.dumps({"order_id": "A1001", "note": "a longer text, so it is cut in pieces"})
    second = json.dumps({"order_id": "A1002"})
    fake_openai.script(
        lambda body: Reply(
            content="Looking both up.",
            tool_calls=[("call_1", "lookup_order", first), ("call_2", "refund_request", second)],
            interleave=interleave,
        )
    )
    pieces: list[str] = []

    turn = _model(fake_openai).complete(USER, [LOOKUP_SPEC], on_delta=pieces.append)

    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_1", "lookup_order", first),
        ("call_2", "refund_request", second),
    ]
    assert "".join(pieces) == turn.content == "Looking both up."


def test_it_keeps_one_connection_to_the_endpoint_across_turns(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(lambda body: Reply(content="Streamed or not, on the same connection."))
    model = _model(fake_openai)

    for on_delta in (None, [].append, [].append, None):
        assert model.complete(USER, [], on_delta=on_delta).content.startswith("Streamed")

    assert len(fake_openai.peers) == 4 and len(set(fake_openai.peers)) == 1


def test_it_raises_model_error_on_http_500(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(lambda body: Reply(status=500, content="the GPU caught fire"))

    with pytest.raises(ModelError, match=r"openai:test-model.*500"):
        _model(fake_openai).complete(USER, [])
    with pytest.raises(ModelError, match=r"openai:test-model.*500"):
        _model(fake_openai).complete(USER, [], on_delta=lambda text: None)
    assert len(fake_openai.requests) == 2  # OPENAI_MAX_RETRIES=0: no retry


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_it_refuses_a_turn_proposing_more_tool_calls_than_it_takes(fake_openai: FakeOpenAI, stream: bool) -> None:
    calls = [(f"call_{n}", "lookup_order", "{}") for n in range(MAX_CALLS_PER_TURN + 1)]
    answers = iter([calls[:MAX_CALLS_PER_TURN], calls])
    fake_openai.script(lambda body: Reply(tool_calls=next(answers)))
    on_delta = (lambda text: None) if stream else None

    most = _model(fake_openai).complete(USER, [LOOKUP_SPEC], on_delta=on_delta)
    with pytest.raises(ModelError, match=f"openai:test-model: .*more than {MAX_CALLS_PER_TURN} tool calls"):
        _model(fake_openai).complete(USER, [LOOKUP_SPEC], on_delta=on_delta)

    assert len(most.tool_calls) == MAX_CALLS_PER_TURN  # the first request: exactly as many as it takes


def test_it_raises_model_error_when_the_endpoint_is_unreachable() -> None:
    with socket.socket() as sock:  # a port that was just free and has no listener now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    model = OpenAIModel("test-model", base_url=f"http://127.0.0.1:{port}/v1")

    with pytest.raises(ModelError, match="openai:test-model"):
        model.complete(USER, [])


def test_it_raises_model_error_when_the_endpoint_is_too_slow(fake_openai: FakeOpenAI, settings: Any) -> None:
    settings.OPENAI_TIMEOUT = 0.3
    fake_openai.script(lambda body: Reply(content="too late", delay=1.0))

    with pytest.raises(ModelError, match="openai:test-model"):
        _model(fake_openai).complete(USER, [])


def test_it_raises_model_error_when_the_endpoint_answers_with_a_web_page(fake_openai: FakeOpenAI) -> None:
    # A proxy in front of the model answering 200 with HTML: nonsense, which is a ModelError.
    fake_openai.script(lambda body: Reply(raw_body="<html><body>Bad gateway</body></html>"))

    with pytest.raises(
        ModelError, match=r"openai:test-model: the endpoint sent something that is not JSON .*Bad gateway"
    ):
        _model(fake_openai).complete(USER, [])
    with pytest.raises(ModelError, match="openai:test-model"):
        _model(fake_openai).complete(USER, [], on_delta=lambda text: None)


def test_it_raises_model_error_when_the_stream_is_cut_off(fake_openai: FakeOpenAI) -> None:
    # The connection drops halfway: half an answer must not pass for the whole one.
    fake_openai.script(
        lambda body: Reply(content="You will get a full refund of the entire amount today.", truncate=True)
    )
    pieces: list[str] = []

    with pytest.raises(ModelError, match="openai:test-model: the stream ended before the model finished"):
        _model(fake_openai).complete(USER, [], on_delta=pieces.append)
    assert pieces  # some text had arrived before the cut


def test_it_reads_arguments_sent_as_an_object_and_text_sent_as_parts(fake_openai: FakeOpenAI) -> None:
    # Some OpenAI-compatible servers send a call's arguments as an object and text as content parts.
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": {"order_id": "A1"}}}
    parts = [{"type": "text", "text": "Looking "}, {"type": "image_url"}, {"type": "text", "text": "it up."}]
    fake_openai.script(lambda body: Reply(body={"choices": [{"message": {"content": parts, "tool_calls": [call]}}]}))

    turn = _model(fake_openai).complete(USER, [LOOKUP_SPEC])

    assert turn.content == "Looking it up."
    assert [(c.id, c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [
        ("call_1", "lookup_order", {"order_id": "A1"})
    ]


@pytest.mark.parametrize(
    "call",
    [{"id": "call_1"}, {"id": 7, "function": "lookup_order"}, {"function": {"name": ["lookup_order"]}}],
    ids=["no-function", "function-not-an-object", "name-not-text"],
)
def test_it_passes_a_malformed_tool_call_on_as_one_the_driver_refuses(fake_openai: FakeOpenAI, call: Any) -> None:
    fake_openai.script(lambda body: Reply(body={"choices": [{"message": {"content": None, "tool_calls": [call]}}]}))

    turn = _model(fake_openai).complete(USER, [LOOKUP_SPEC])

    assert turn.content == "" and len(turn.tool_calls) == 1
    assert turn.tool_calls[0].name == ""  # no tool has that name: the driver tells the model so


@pytest.mark.parametrize(
    "body",
    [{"choices": [{"finish_reason": "stop"}]}, {"choices": [{"message": "hello"}]}, {"choices": []}, {"id": "x"}],
    ids=["no-message", "message-not-an-object", "no-choice", "no-choices"],
)
def test_it_raises_model_error_when_the_answer_has_no_message(fake_openai: FakeOpenAI, body: dict[str, Any]) -> None:
    fake_openai.script(lambda request: Reply(body=body))

    with pytest.raises(ModelError, match=r"openai:test-model: the endpoint"):
        _model(fake_openai).complete(USER, [])


def test_it_joins_streamed_calls_sent_without_an_index_by_their_place(fake_openai: FakeOpenAI) -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    calls = [
        {"id": "call_1", "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}},
        {"id": "call_2", "function": {"name": "lookup_order", "arguments": '{"order_id": "A2"}'}},
    ]
    chunks = [chunk({"content": "Both."}), chunk({"tool_calls": calls}), "not a chunk", chunk({}, "tool_calls")]
    fake_openai.script(lambda body: Reply(chunks=chunks))  # type: ignore[arg-type]
    pieces: list[str] = []

    turn = _model(fake_openai).complete(USER, [LOOKUP_SPEC], on_delta=pieces.append)

    assert pieces == ["Both."] and turn.content == "Both."
    assert [(c.id, c.arguments) for c in turn.tool_calls] == [
        ("call_1", '{"order_id": "A1"}'),
        ("call_2", '{"order_id": "A2"}'),
    ]


# -- the whole runtime with an openai agent ------------------------------------------------


def _configure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: FakeOpenAI) -> None:
    config = {
        "agents": {
            "support": {
                "model": "openai:test-model",
                "base_url": server.base_url,
                "system_prompt": "You are a support agent.",
                "tools": ["lookup_order", "refund_request"],
                "max_steps": 5,
            }
        },
        "tool_overrides": {"refund_request": {"risk": "high", "hitl_mode": "suspend"}},
    }
    path = tmp_path / "agentfast.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    monkeypatch.setenv("AGENTFAST_CONFIG", str(path))


@pytest.fixture
def openai_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAI) -> FakeOpenAI:
    """The `support` agent configured with model openai:test-model at the fake server."""
    _configure(tmp_path, monkeypatch, fake_openai)
    return fake_openai


def _start(task: str) -> str:
    return services.run_create(agent="support", input=task, enqueue=False).id


def _tool_outputs(run_id: str) -> dict[str, dict[str, Any]]:
    return {
        m.tool_call_id: json.loads(m.content) for m in Message.objects.filter(run_id=run_id, role=Message.Role.TOOL)
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_it_tells_the_model_about_malformed_tool_arguments_and_goes_on(
    db, openai_agent: FakeOpenAI, stream: bool
) -> None:  # noqa: ANN001
    def respond(body: dict[str, Any]) -> Reply:
        results = tool_messages(body)
        if not results:
            return Reply(tool_calls=[("call_bad", "lookup_order", '{"order_id": "A1001"')])
        if len(results) == 1:
            return Reply(
                content="Sorry, let me fix that.", tool_calls=[("call_good", "lookup_order", '{"order_id": "A1001"}')]
            )
        return Reply(content=f"Order A1001 is {results[-1]['content']['result']['status']}.")

    openai_agent.script(respond)
    run_id = _start("Where is order A1001?")

    result = drive(run_id, stream=stream)

    assert result.status == "completed"
    run = Run.objects.get(pk=run_id)
    assert run.output == "Order A1001 is delivered."
    assert run.error == ""
    first, second, third = openai_agent.requests
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert {t["function"]["name"] for t in first["tools"]} == {"lookup_order", "refund_request"}
    # The model sees what it wrote, then the error about it, in its next request.
    assert second["messages"][-2]["tool_calls"][0]["function"]["arguments"] == '{"order_id": "A1001"'
    [error] = tool_messages(second)
    assert error["tool_call_id"] == "call_bad"
    assert error["content"]["ok"] is False
    assert error["content"]["error_code"] == "INVALID_ARGUMENTS"
    assert "JSON" in error["content"]["message"]
    assert tool_messages(third)[-1]["content"]["ok"] is True
    assert ToolCall.objects.get(run_id=run_id, call_id="call_bad").status == ToolCall.Status.FAILED
    assert ToolCall.objects.get(run_id=run_id, call_id="call_good").status == ToolCall.Status.SUCCEEDED


def test_it_tells_the_model_about_an_unknown_tool_and_goes_on(db, openai_agent: FakeOpenAI) -> None:  # noqa: ANN001
    def respond(body: dict[str, Any]) -> Reply:
        if not tool_messages(body):
            return Reply(tool_calls=[("call_x", "delete_all_orders", "{}")])
        return Reply(content="I cannot do that.")

    openai_agent.script(respond)
    run_id = _start("Delete every order.")

    assert drive(run_id).status == "completed"

    assert Run.objects.get(pk=run_id).output == "I cannot do that."
    [error] = tool_messages(openai_agent.requests[1])
    assert error["tool_call_id"] == "call_x"
    assert error["content"]["error_code"] == "UNKNOWN_TOOL"
    assert "delete_all_orders" in error["content"]["message"]
    assert "lookup_order" in error["content"]["message"]  # the model is told what exists
    assert SideEffect.objects.count() == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_it_pauses_a_refund_for_approval_and_runs_it_once_after(db, openai_agent: FakeOpenAI, stream: bool) -> None:  # noqa: ANN001
    def respond(body: dict[str, Any]) -> Reply:
        results = tool_messages(body)
        if not results:
            return Reply(tool_calls=[("call_refund", "refund_request", '{"order_id": "A1001", "amount_cents": 2500}')])
        return Reply(content=f"Refunded, reference {results[-1]['content']['result']['refund_id']}.")

    openai_agent.script(respond)
    run_id = _start("Refund order A1001 for 25.00 USD")

    assert drive(run_id, stream=stream).status == "suspended"

    [approval] = Approval.objects.filter(run_id=run_id)
    assert approval.id == f"appr_{run_id}_call_refund"
    assert approval.status == Approval.Status.PENDING
    assert approval.tool == "refund_request"
    assert SideEffect.objects.count() == 0  # nothing ran before a person decided
    assert len(openai_agent.requests) == 1
    assert drive(run_id, stream=stream).driven is False  # waits on the person, not the model
    assert len(openai_agent.requests) == 1

    services.approval_decide(
        approval_id=approval.id,
        decision="approved",
        attempt=services.Attempt(actor="alice", source="cli"),
        auto_resume=False,
    )
    assert drive(run_id, stream=stream).status == "completed"

    assert len(openai_agent.requests) == 2
    [result] = tool_messages(openai_agent.requests[1])
    assert result["tool_call_id"] == "call_refund"
    assert result["content"]["ok"] is True
    assert result["content"]["result"]["order_id"] == "A1001"
    assert result["content"]["result"]["amount_cents"] == 2500
    [effect] = SideEffect.objects.all()
    assert effect.tool == "refund_request"
    assert effect.arguments == {"order_id": "A1001", "amount_cents": 2500}
    run = Run.objects.get(pk=run_id)
    assert run.output == f"Refunded, reference {result['content']['result']['refund_id']}."
    # Driving a finished run again changes nothing: the refund stays done once.
    assert drive(run_id, stream=stream).driven is False
    assert SideEffect.objects.count() == 1


def test_it_streams_the_final_answer_through_the_runtime(db, openai_agent: FakeOpenAI) -> None:  # noqa: ANN001
    answer = "Order A1001 was delivered; its total is 50.00 USD."

    def respond(body: dict[str, Any]) -> Reply:
        if not tool_messages(body):
            return Reply(tool_calls=[("call_lookup", "lookup_order", '{"order_id": "A1001"}')])
        return Reply(content=answer)

    openai_agent.script(respond)
    run_id = _start("Where is order A1001?")
    pieces: list[str] = []

    assert drive(run_id, on_delta=pieces.append).status == "completed"

    assert all(request["stream"] is True for request in openai_agent.requests)
    assert pieces == text_pieces(answer)
    assert Run.objects.get(pk=run_id).output == answer
    # The streamed tool call was joined from its fragments into valid arguments.
    assert _tool_outputs(run_id)["call_lookup"]["result"]["total_cents"] == 5000


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_it_fails_the_run_when_the_model_endpoint_returns_500(db, openai_agent: FakeOpenAI, stream: bool) -> None:  # noqa: ANN001
    openai_agent.script(lambda body: Reply(status=500, content="upstream overloaded"))
    run_id = _start("Where is order A1001?")

    result = drive(run_id, stream=stream)

    assert result.status == "failed"
    run = Run.objects.get(pk=run_id)
    assert "openai:test-model" in run.error
    assert "500" in run.error
    assert "internal error" not in run.error  # a model failure, not a crash
    assert list(Message.objects.filter(run_id=run_id).values_list("role", flat=True)) == ["user"]


def test_it_fails_the_run_when_the_stream_is_cut_off_instead_of_keeping_half_an_answer(
    db, openai_agent: FakeOpenAI
) -> None:  # noqa: ANN001
    openai_agent.script(
        lambda body: Reply(content="Your refund of the whole order is approved and sent.", truncate=True)
    )
    run_id = _start("Where is order A1001?")

    assert drive(run_id, on_delta=lambda text: None).status == "failed"

    run = Run.objects.get(pk=run_id)
    assert run.output == ""
    assert "openai:test-model" in run.error
    assert "internal error" not in run.error


def test_it_shares_one_client_per_endpoint_in_a_process(fake_openai: FakeOpenAI) -> None:
    # Building a client loads the CA bundle into an SSL context: once per endpoint, not per drive.
    first = OpenAIModel("test-model", base_url=fake_openai.base_url)
    second = OpenAIModel("other-model", base_url=fake_openai.base_url)
    elsewhere = OpenAIModel("test-model", base_url=fake_openai.base_url + "/other")

    assert first.client is second.client
    assert elsewhere.client is not first.client
    fake_openai.script(lambda body: Reply(content=f"hello {body['model']}"))
    assert [first.complete(USER, []).content, second.complete(USER, []).content] == [
        "hello test-model",
        "hello other-model",
    ]


@pytest.mark.parametrize(("models", "imported"), [(["demo"], False), (["demo", "openai:gpt-test"], True)])
def test_it_preloads_the_openai_provider_only_when_an_agent_uses_it(models: list[str], imported: bool) -> None:
    script = (
        "import sys; from agents.llm.base import preload_providers; "
        f"preload_providers({models!r}); print('openai' in sys.modules)"
    )
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert found.stdout.strip() == str(imported)


def _live_deltas(run_id: str, drive_it: Callable[[], object]) -> list[str]:
    """Drive the run while listening on its group, as a viewer's socket does; return the delta texts pushed."""
    layer = get_channel_layer()

    async def watch() -> list[str]:
        channel = await layer.new_channel()
        await layer.group_add(events.run_group(run_id), channel)
        await sync_to_async(drive_it)()  # on this test's thread, in its transaction
        await sync_to_async(events._publisher.flush)()
        texts = []
        while True:
            try:
                message = await asyncio.wait_for(layer.receive(channel), 1.0)
            except TimeoutError:
                return texts
            if message["event"] == "delta":
                texts.append(message["data"]["text"])

    return async_to_sync(watch)()


def test_it_pushes_a_fast_stream_to_viewers_in_fewer_deltas_than_pieces(db, openai_agent: FakeOpenAI) -> None:
    answer = " ".join(f"word{n}" for n in range(40))
    openai_agent.script(lambda body: Reply(content=answer))
    run_id = _start("Say forty words.")
    pieces: list[str] = []

    texts = _live_deltas(run_id, lambda: drive(run_id, on_delta=pieces.append))

    assert pieces == text_pieces(answer)  # the caller's own sink still gets every piece
    assert "".join(texts) == answer
    assert 1 <= len(texts) < len(pieces)


def test_it_pushes_each_piece_of_a_slow_stream_as_it_comes(db, openai_agent: FakeOpenAI) -> None:
    answer = "Slowly but surely."
    openai_agent.script(lambda body: Reply(content=answer, chunk_delay=_Deltas.DELTA_SECONDS * 2))
    run_id = _start("Take your time.")

    texts = _live_deltas(run_id, lambda: drive(run_id))

    assert texts == text_pieces(answer)
