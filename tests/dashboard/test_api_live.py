"""The API against a live daphne server: curl, SSE streams, and a resume streamed in the request.

The server is a real `python -m daphne` process on the test database and the test run's
Redis; runs are driven in this process (or a real Celery worker), so every event crosses
processes through Redis, as in production.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction

from agents import events, runtime, services
from agents.models import Approval, AuditEntry, Run, RunEvent, SideEffect
from dashboard.processes import listen_endpoint
from tests.conftest import ROOT, child_env, wait_for
from tests.support import flows

REFUND = "Refund order A1001 for 25.00 USD"

pytestmark = pytest.mark.integration


# -- a live server -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A daphne process serving the project on the test database; its URL."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("daphne") / "daphne.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-e", listen_endpoint("127.0.0.1", port), "dashboard.asgi:application"],
            cwd=ROOT,
            env=child_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until_serving(url, process, log_path)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=10)


def _wait_until_serving(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/api/openapi.json", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"daphne did not start:\n{log_path.read_text()[-3000:]}")


@pytest.fixture
def token(transactional_db: None, alice: User) -> str:
    return services.token_create(username="alice")[1]


# -- an SSE client -----------------------------------------------------------------------


@dataclass
class Frame:
    event: str | None  # None: a comment line (": live", ": heartbeat")
    id: int | str | None = None  # a run's seq; /api/events: a cursor (`1200` is read as the number)
    data: Any = None
    comment: str = ""


class EventStream:
    """Read server-sent events frame by frame; a silent server fails the test after 10 s."""

    def __init__(self, method: str, url: str, headers: dict[str, str]) -> None:
        self.client = httpx.Client(timeout=httpx.Timeout(10.0))
        self.context = self.client.stream(method, url, headers={"Accept": "text/event-stream", **headers})
        self.response = self.context.__enter__()
        assert self.response.status_code == 200, self.response.read()
        assert self.response.headers["content-type"].startswith("text/event-stream")
        self.lines = self.response.iter_lines()
        self.frames: list[Frame] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.context.__exit__(None, None, None)
        self.client.close()

    def next(self) -> Frame | None:
        """Return the next frame, or None when the server closed the stream."""
        fields: dict[str, str] = {}
        for line in self.lines:
            if line == "":
                if fields:
                    return self._keep(fields)
                continue
            name, _, value = line.partition(":")
            fields[name or "comment"] = value.removeprefix(" ")
        return None

    def _keep(self, fields: dict[str, str]) -> Frame:
        if "comment" in fields and "event" not in fields:
            frame = Frame(event=None, comment=fields["comment"])
        else:
            frame = Frame(
                event=fields["event"], id=_id(fields["id"]) if "id" in fields else None, data=json.loads(fields["data"])
            )
        self.frames.append(frame)
        return frame

    def until(self, done: Callable[[Frame], bool]) -> list[Frame]:
        """Read frames up to and including the first that `done` accepts."""
        start = len(self.frames)
        while (frame := self.next()) is not None:
            if done(frame):
                return self.frames[start:]
        raise AssertionError(f"the stream ended before the expected frame; got {self.frames[start:]}")

    def rest(self) -> list[Frame]:
        """Read until the server closes the stream."""
        start = len(self.frames)
        while self.next() is not None:
            pass
        return self.frames[start:]


def _id(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def stream(url: str, token: str, method: str = "GET", **headers: str) -> EventStream:
    return EventStream(method, url, {"Authorization": f"Bearer {token}", **headers})


def stored(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.event is not None and f.id is not None]


def is_live(frame: Frame) -> bool:
    return frame.comment == "live"


def seqs(run: Run) -> list[int]:
    return list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))


# -- the curl example of the issue -------------------------------------------------------


def test_concurrent_decisions_each_land_once_with_one_audit_row_each(server: str, token: str) -> None:
    """The server decides side by side (a pool of threads): repeats and rivals still count once."""
    runs = [flows.start(REFUND, auto_resume=False) for _ in range(6)]  # each paused on its gated call
    approval_ids = [flows.pending(run)[0].id for run in runs]
    # Each approval: the same approval three times and a rejection, all at once.
    asks = [(approval_id, decision) for approval_id in approval_ids for decision in ("approved",) * 3 + ("rejected",)]
    headers = {"Authorization": f"Bearer {token}"}

    def ask(item: tuple[str, str]) -> tuple[str, int, dict[str, Any]]:
        approval_id, decision = item
        response = httpx.post(
            f"{server}/api/approvals/{approval_id}/decide", json={"decision": decision}, headers=headers, timeout=30
        )
        return approval_id, response.status_code, response.json()

    with ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(ask, asks))

    for approval_id in approval_ids:
        approval = Approval.objects.get(pk=approval_id)
        mine = [(status, body) for aid, status, body in answers if aid == approval_id]
        decided = [body for status, body in mine if status == 200 and body["outcome"] == "decided"]
        assert len(decided) == 1, mine
        assert decided[0]["status"] == approval.status
        assert {status for status, _ in mine} <= {200, 409}
        audited = AuditEntry.objects.filter(approval_id=approval_id)
        assert audited.filter(outcome=AuditEntry.Outcome.DECIDED).count() == 1
        assert audited.count() == 4  # every attempt, refused or not
    assert services.audit_verify().ok


def test_it_takes_the_curl_example_of_the_issue(server: str, start_worker: Callable[..., Any]) -> None:
    """The issue's command verbatim, with a real token and the id of a real approval."""
    services.user_create(username="alice@ops", role="reviewer")
    token = services.token_create(username="alice@ops")[1]
    start_worker()
    run = flows.start(REFUND)  # auto_resume on: the decision enqueues the resume
    approval_id = flows.pending(run)[0].id
    result = subprocess.run(
        [
            "curl",
            "-sS",
            "-X",
            "POST",
            f"{server}/api/approvals/{approval_id}/decide",
            "-H",
            f"Authorization: Bearer {token}",
            "-H",
            "Content-Type: application/json",
            "-d",
            '{"decision":"approved","decided_by":"alice@ops"}',
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    body = json.loads(result.stdout)
    assert (body["status"], body["decided_by"], body["resume_enqueued"]) == ("approved", "alice@ops", True)
    wait_for(lambda: Run.objects.get(pk=run.id).status == Run.Status.COMPLETED, what="the worker to resume the run")
    assert SideEffect.objects.filter(idempotency_key=approval_id).count() == 1


# -- SSE ---------------------------------------------------------------------------------


def test_it_sends_approval_required_to_a_client_connected_before_the_pause(server: str, token: str) -> None:
    run = services.run_create(agent="support", input=REFUND, enqueue=False)
    with stream(f"{server}/api/runs/{run.id}/events", token) as events:
        events.until(is_live)
        runtime.drive(run.id)  # another process than the server: the pause reaches it through Redis
        frames = events.until(lambda f: f.event == "approval_required")
    pause = frames[-1]
    approval = Approval.objects.get(run=run)
    assert pause.id == pause.data["seq"] == seqs(run)[-1]
    assert pause.data["run_id"] == run.id
    details = pause.data["data"]
    assert (details["approval_id"], details["tool"], details["run_status"]) == (
        approval.id,
        "refund_request",
        "suspended",
    )
    assert details["arguments"] == {"order_id": "A1001", "amount_cents": 2500}
    assert [f.id for f in stored(frames)] == seqs(run)


def test_it_sends_a_reconnecting_client_exactly_the_events_it_missed(server: str, token: str) -> None:
    run = flows.start(REFUND, auto_resume=False)
    url = f"{server}/api/runs/{run.id}/events"
    with stream(url, token) as first:
        seen = stored(first.until(is_live))
    approval = flows.pending(run)[0]
    flows.decide(approval, "approved", auto_resume=False)
    # The reconnect races a resume that publishes while the replay is being read.
    driver = threading.Thread(target=flows.resume, args=(run,))
    driver.start()
    try:
        with stream(url, token, **{"Last-Event-ID": str(seen[-1].id)}) as second:
            missed = stored(second.rest())  # the server closes it after run_status completed
    finally:
        driver.join()
    assert [f.id for f in seen] + [f.id for f in missed] == seqs(run)
    assert missed[0].event == "approval_decided"
    assert (missed[-1].event, missed[-1].data["data"]["status"]) == ("run_status", "completed")


def test_it_closes_a_finished_runs_stream_after_its_replay(server: str, token: str) -> None:
    run = flows.start("Refund order Z9999 for 1.00 USD")  # no such order: completes at once
    with stream(f"{server}/api/runs/{run.id}/events?after=1", token) as events:
        frames = events.rest()
    assert [f.id for f in frames] == seqs(run)[1:]
    assert frames[-1].data["data"]["status"] == "completed"


def _approval_events() -> list[tuple[int, str, int]]:
    rows = RunEvent.objects.filter(type__in=["approval_required", "approval_decided"]).order_by("pk")
    return list(rows.values_list("pk", "run_id", "seq"))


def _covers(frame: Frame, pk: int) -> bool:
    """Whether the frame's id (a cursor: `upto` or `upto:pk,pk…`) counts RunEvent `pk` as sent."""
    upto, _, also = str(frame.id).partition(":")
    return pk <= int(upto) or str(pk) in also.split(",")


def test_it_streams_every_runs_approval_events_with_cursors_over_event_pks_as_ids(server: str, token: str) -> None:
    with stream(f"{server}/api/events", token) as feed:
        feed.until(is_live)
        first = flows.start(REFUND)
        required = feed.until(lambda f: f.event == "approval_required")[-1]
        flows.decide(flows.pending(first)[0], "rejected", note="no", auto_resume=False)
        decided = feed.until(lambda f: f.event == "approval_decided")[-1]
    rows = _approval_events()
    assert [(f.data["run_id"], f.data["seq"]) for f in (required, decided)] == [(r[1], r[2]) for r in rows]
    assert _covers(required, rows[0][0]) and not _covers(required, rows[1][0])
    assert _covers(decided, rows[0][0]) and _covers(decided, rows[1][0])
    assert (required.data["run_id"], decided.data["data"]["decision"]) == (first.id, "rejected")
    second = flows.start("Refund order A1002 for 15.00 USD")  # while nobody listens
    with stream(f"{server}/api/events", token, **{"Last-Event-ID": str(decided.id)}) as feed:
        missed = stored(feed.until(is_live))
    assert [(f.event, f.data["run_id"]) for f in missed] == [("approval_required", second.id)]
    with stream(f"{server}/api/events", token, **{"Last-Event-ID": str(rows[0][0])}) as feed:  # a bare pk, as before
        missed = stored(feed.until(is_live))
    assert [(f.event, f.data["run_id"]) for f in missed] == [
        ("approval_decided", first.id),
        ("approval_required", second.id),
    ]


def _publish_approval(run_id: str) -> None:
    """Record an approval_required event of a run (through the engine's own events.publish)."""
    with transaction.atomic():
        events.publish(run_id=run_id, type=RunEvent.Type.APPROVAL_REQUIRED, data={"approval_id": f"appr_{run_id}"})


def _publish_approval_held(run_id: str, inserted: threading.Event, release: threading.Event) -> None:
    """`_publish_approval` in a thread whose transaction stays open, the event's pk taken, until `release`."""
    try:
        with transaction.atomic():
            _publish_approval(run_id)  # a savepoint of the open transaction
            inserted.set()
            assert release.wait(30)
    finally:
        connection.close()  # this thread's own


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite admits one writer at a time: pks commit in order")
def test_a_reconnect_gets_an_event_committed_after_a_newer_one_it_had_once(server: str, token: str) -> None:
    """Event A takes its pk first, B commits first: a client that had B and reconnects still gets A, once.

    A bare pk as the id ("every event up to B") lost A for good.
    """
    a_run, b_run = (services.run_create(agent="support", input=REFUND, enqueue=False) for _ in "ab")
    url = f"{server}/api/events"
    inserted, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_publish_approval_held, args=(a_run.id, inserted, release))
    try:
        with stream(url, token) as feed:
            feed.until(is_live)
            holder.start()
            assert inserted.wait(10)  # A has its pk, uncommitted
            _publish_approval(b_run.id)
            had_b = feed.until(lambda f: f.event == "approval_required")[-1]
        assert had_b.data["run_id"] == b_run.id
        assert [row[1] for row in _approval_events()] == [b_run.id]  # A is not committed yet
        # Reconnect while A is still in flight: nothing to replay; A arrives live once it commits.
        with stream(url, token, **{"Last-Event-ID": str(had_b.id)}) as feed:
            assert stored(feed.until(is_live)) == []
            release.set()
            holder.join(10)
            had_a = feed.until(lambda f: f.event == "approval_required")[-1]
        assert had_a.data["run_id"] == a_run.id
    finally:
        release.set()
        holder.join(10)
    (a_pk, _, _), (b_pk, _, _) = _approval_events()
    assert a_pk < b_pk
    # A client that lost the connection before A came reconnects after A committed: the replay has A alone.
    with stream(url, token, **{"Last-Event-ID": str(had_b.id)}) as feed:
        replayed = stored(feed.until(is_live))
    assert [f.data["run_id"] for f in replayed] == [a_run.id]
    # One that had A too gets nothing twice.
    for frame in (had_a, replayed[-1]):
        with stream(url, token, **{"Last-Event-ID": str(frame.id)}) as feed:
            assert stored(feed.until(is_live)) == []


# -- resume and stream -------------------------------------------------------------------


def _resume(server: str, token: str, run: Run, after: int) -> list[Frame]:
    with stream(f"{server}/api/runs/{run.id}/resume?after={after}", token, method="POST") as events:
        return events.rest()


def test_it_drives_a_run_in_the_request_and_streams_it_to_the_final_answer(server: str, token: str) -> None:
    run = services.run_create(agent="support", input=REFUND, auto_resume=False, enqueue=False)
    first = _resume(server, token, run, after=0)
    assert first[-1].data == {"run_id": run.id, "status": "suspended", "driven": True}
    assert first[-2].event == "approval_required"
    tokens = "".join(f.data["data"]["text"] for f in first if f.event == "delta")
    assert tokens == "Let me look up order A1001 first."

    approval = flows.pending(run)[0]
    flows.decide(approval, "approved", auto_resume=False)
    second = _resume(server, token, run, after=stored(first)[-1].id)
    assert [f.id for f in stored(first + second)] == seqs(run)  # nothing missed, nothing twice
    assert stored(second)[0].event == "approval_decided"
    answer = next(f for f in second if f.event == "message").data["data"]["content"]
    assert "".join(f.data["data"]["text"] for f in second if f.event == "delta") == answer
    assert second[-1].data == {"run_id": run.id, "status": "completed", "driven": True}
    assert SideEffect.objects.filter(idempotency_key=approval.id).count() == 1
