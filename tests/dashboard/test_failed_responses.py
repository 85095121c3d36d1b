"""A response whose application fails after its status went out is ended, not left open."""

from __future__ import annotations

from typing import Any

import pytest

from dashboard.limits import EndFailedResponses
from tests.support.asgi import http_scope

Message = dict[str, Any]


def _app(*, fail_after: int | None, parts: int = 2) -> Any:
    """An ASGI app that starts a 200, sends `parts` pieces of body, failing after `fail_after` of them."""

    async def app(scope: Message, receive: Any, send: Any) -> None:
        if fail_after == -1:
            raise RuntimeError("before the status")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for n in range(parts):
            if n == fail_after:
                raise RuntimeError("the database went away")
            await send({"type": "http.response.body", "body": f"event {n}\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


async def _serve(app: Any) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await EndFailedResponses(app)(http_scope("/api/v1/events", []), receive, send)
    return sent


async def test_a_stream_that_fails_part_way_is_ended_and_the_failure_logged(caplog: pytest.LogCaptureFixture) -> None:
    sent = await _serve(_app(fail_after=1))

    assert [m.get("body") for m in sent[1:]] == [b"event 0\n", b""]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert "GET /api/v1/events failed after its response began; ending it" in caplog.text
    assert "the database went away" in caplog.text  # the traceback


async def test_a_failure_before_the_status_is_the_servers_500() -> None:
    with pytest.raises(RuntimeError, match="before the status"):
        await _serve(_app(fail_after=-1))


async def test_a_response_that_ends_is_passed_through_untouched() -> None:
    sent = await _serve(_app(fail_after=None))

    assert [m["type"] for m in sent] == ["http.response.start", *["http.response.body"] * 3]
    assert sent[-1] == {"type": "http.response.body", "body": b""}  # one end, not two
