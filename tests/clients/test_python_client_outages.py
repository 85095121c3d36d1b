"""The Python client through outages: a restart mid-wait or mid-report, 503/429 with Retry-After, no server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from agentfast_client import AlreadyClaimed, AsyncGate, Gate, GateError

from agents.models import ToolCall
from tests.clients.conftest import Server
from tests.support.processes import free_port

pytestmark = pytest.mark.integration


def _restart_later(server: Server, *, after: float) -> threading.Thread:
    """Kill the server now and start it again on the same port `after` seconds later."""
    server.daphne.kill()

    def again() -> None:
        time.sleep(after)
        server.daphne.start()
        server.daphne.wait_ready(timeout=20)

    thread = threading.Thread(target=again)
    thread.start()
    return thread


class Front:
    """A local HTTP server standing for a load balancer: it answers some requests itself, forwards the rest."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.port = upstream, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.refuse: dict[str, list[tuple[int, str]]] = {}  # path suffix -> (status, Retry-After) answers to give
        self.seen: list[tuple[str, str, int]] = []
        front = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                for suffix, answers in front.refuse.items():
                    if self.path.split("?")[0].endswith(suffix) and answers:
                        status, retry_after = answers.pop(0)
                        front.seen.append((self.command, self.path, status))
                        self.send_response(status)
                        self.send_header("Retry-After", retry_after)
                        self.send_header("Content-Type", "text/html")
                        self.end_headers()
                        self.wfile.write(b"<html>busy</html>")
                        return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request(self.command, front.upstream + self.path, content=body, headers=headers)
                front.seen.append((self.command, self.path, answer.status_code))
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = _any

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def front(server: Server) -> Iterator[Front]:
    proxy = Front(server.url)
    yield proxy
    proxy.stop()


def test_it_keeps_the_result_of_a_call_that_ran_while_the_server_restarted(server: Server) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="outage-1")
    ran: list[str] = []
    restarted: list[threading.Thread] = []

    @gate.guard(tool="lookup_order")
    def lookup_order(order: str) -> dict[str, Any]:
        ran.append(order)
        restarted.append(_restart_later(server, after=1.5))  # the report finds nobody listening at first
        return {"order": order, "state": "shipped"}

    assert lookup_order("A-1", call_id="o1") == {"order": "A-1", "state": "shipped"}
    restarted[0].join()
    assert ToolCall.objects.get(name="lookup_order").result == {
        "ok": True,
        "result": {"order": "A-1", "state": "shipped"},
    }
    assert lookup_order("A-1", call_id="o1") == {"order": "A-1", "state": "shipped"}  # the stored result
    assert ran == ["A-1"]


def test_it_waits_on_through_a_restart_and_runs_the_call_once(server: Server) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="outage-2")
    approval_id = server.approval_id(agent="billing", session="outage-2", call_id="w1")
    outcome: dict[str, Any] = {}
    wires: list[int] = []

    def wire(cents: int) -> str:
        wires.append(cents)
        return "sent"

    def flow() -> None:
        try:
            outcome["value"] = gate.run(gate.require("wire_money", {"cents": 900}, call_id="w1", timeout=60), wire)
        except Exception as exc:  # noqa: BLE001 (the test asserts on it)
            outcome["error"] = exc

    thread = threading.Thread(target=flow)
    thread.start()
    server.await_pending(approval_id)
    time.sleep(0.5)  # the client is inside its wait
    _restart_later(server, after=1.5).join()
    server.decide(approval_id, "approved")
    thread.join(timeout=90)

    assert outcome == {"value": "sent"} and wires == [900]


def test_it_honours_retry_after_of_a_busy_server_and_stores_one_result(server: Server, front: Front) -> None:
    front.refuse = {"/result": [(503, "1"), (429, "1")], "/api/gate": [(503, "0")]}
    gate = Gate(front.url, server.agent_token, agent="billing", session="outage-3")
    ran: list[str] = []
    started = time.monotonic()

    permit = gate.require("lookup_order", {"order": "B-2"}, call_id="b2")
    assert gate.run(permit, lambda order: ran.append(order) or f"order {order}") == "order B-2"

    assert time.monotonic() - started >= 2  # it waited as told, twice
    assert [status for method, path, status in front.seen if path.endswith("/result")] == [503, 429, 200]
    assert ran == ["B-2"]
    assert ToolCall.objects.get(name="lookup_order").result == {"ok": True, "result": "order B-2"}


def test_it_retries_an_async_report_through_a_busy_server(server: Server, front: Front) -> None:
    import asyncio

    front.refuse = {"/result": [(502, "0"), (504, "0")]}

    async def flow() -> Any:
        gate = AsyncGate(front.url, server.agent_token, agent="billing", session="outage-4")
        try:
            permit = await gate.require("lookup_order", {"order": "C-3"}, call_id="c3")
            return await gate.run(permit, lambda order: f"order {order}")
        finally:
            await gate.aclose()

    assert asyncio.run(flow()) == "order C-3"
    assert ToolCall.objects.get(name="lookup_order").result == {"ok": True, "result": "order C-3"}


def test_it_raises_a_gate_error_naming_the_server_when_none_answers(server: Server) -> None:
    gate = Gate(f"http://127.0.0.1:{free_port()}", server.agent_token, agent="billing", retry_for=1)
    started = time.monotonic()
    with pytest.raises(GateError) as refused:
        gate.require("lookup_order", {"order": "D-4"}, call_id="d4")
    assert "cannot reach agentfast" in str(refused.value) and refused.value.code == "unreachable"
    assert 1 <= time.monotonic() - started < 10

    started = time.monotonic()
    with pytest.raises(GateError) as mistyped:  # no scheme: said at once, not after the retries
        Gate("localhost:8321", server.agent_token).require("lookup_order", {"order": "D-4"}, call_id="d4")
    assert mistyped.value.code == "bad_url" and time.monotonic() - started < 5


def test_it_raises_a_gate_error_for_an_answer_that_is_not_agentfasts(server: Server, front: Front) -> None:
    front.refuse = {"/api/gate": [(404, "0")]}  # a proxy's page, not JSON
    gate = Gate(front.url, server.agent_token, agent="billing")
    with pytest.raises(GateError) as refused:
        gate.require("lookup_order", {"order": "E-5"}, call_id="e5")
    assert refused.value.status == 404 and "busy" in str(refused.value)


def test_it_says_which_token_was_refused_and_never_retries_it(server: Server, front: Front) -> None:
    gate = Gate(front.url, "af_not-a-token", agent="billing")
    with pytest.raises(GateError) as refused:
        gate.require("lookup_order", {"order": "F-6"}, call_id="f6")
    assert refused.value.status == 401
    assert len(front.seen) == 1


def test_it_never_runs_a_call_whose_claim_answer_was_lost(server: Server, front: Front) -> None:
    gate = Gate(front.url, server.agent_token, agent="billing", session="outage-5")
    gate.gate("lookup_order", {"order": "G-7"}, call_id="g7")
    approval_id = server.approval_id(agent="billing", session="outage-5", call_id="g7")
    assert gate.claim(approval_id)["claimed"]  # claimed here, but say its answer never arrived
    with pytest.raises(AlreadyClaimed):
        gate.require("lookup_order", {"order": "G-7"}, call_id="g7")


def test_it_refuses_arguments_json_cannot_carry_with_a_gate_error_before_anything_runs(server: Server) -> None:
    gate = Gate(server.url, server.agent_token, agent="billing", session="odd-1")
    ran: list[Any] = []

    @gate.guard(tool="measure")
    def measure(value: Any) -> str:
        ran.append(value)
        return "measured"

    for odd, says in ((float("nan"), "not JSON"), (object(), "not JSON"), ("report\udce9.csv", "arguments")):
        with pytest.raises(GateError) as refused:
            measure(odd, call_id="odd")
        assert says in str(refused.value)
    assert ran == [] and not ToolCall.objects.exists()
