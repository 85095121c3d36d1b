"""A real daphne under abuse: huge bodies, many streams, and streams whose access ends.

Requests go over raw sockets where the test must see what the server answers before the
body is sent; the server's memory and threads are read from /proc.
"""

from __future__ import annotations

import base64
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from agents import services
from tests.conftest import child_env, wait_for
from tests.support import flows
from tests.support.processes import Daphne

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

MB = 1024 * 1024
STREAMS_PER_USER = 40


@pytest.fixture(scope="module")
def daphne(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    log = tmp_path_factory.mktemp("daphne") / "daphne.log"
    server = Daphne(log=log, env=child_env(AGENTFAST_STREAMS_PER_USER=str(STREAMS_PER_USER)))
    server.start()
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture
def token(alice: User) -> str:
    return services.token_create(username="alice")[1]


def _status(pid: int, field: str) -> int:
    """Return a number from /proc/<pid>/status (VmRSS in kB, Threads)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _connect(server: Daphne) -> socket.socket:
    parts = urlsplit(server.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    return sock


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one response whose body has a Content-Length (or ends with the connection)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    length = int(headers.get("content-length", "-1"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body


# -- item 4: bodies are refused before they are read ---------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 401, "unauthenticated"),  # anonymous: refused whatever the size
        ({"Authorization": "Bearer af_0000_not-a-token"}, 413, "body_too_large"),
    ],
)
def test_it_refuses_an_800_mb_post_before_its_body_is_sent(
    daphne: Daphne, headers: dict[str, str], status: int, code: str
) -> None:
    with _connect(daphne) as sock:
        sock.sendall(
            _head("POST", "/api/runs", {"Content-Type": "application/json", "Content-Length": str(800 * MB), **headers})
        )
        answer, _, body = _response(sock)  # not one byte of the body was sent

    assert (answer, json.loads(body)["error_code"]) == (status, code)


def test_it_refuses_a_bad_token_before_reading_a_body_under_the_cap(daphne: Daphne) -> None:
    with _connect(daphne) as sock:
        sock.sendall(
            _head("POST", "/api/runs", {"Content-Length": str(100 * 1024), "Authorization": "Bearer af_0000_nope"})
        )
        answer, _, body = _response(sock)

    assert (answer, json.loads(body)["error_code"]) == (401, "unauthenticated")


@pytest.mark.parametrize("content_type", ["multipart/form-data", "multipart/form-data; boundary=xyz"])
def test_it_refuses_a_multipart_body_to_the_api_with_a_json_415(daphne: Daphne, token: str, content_type: str) -> None:
    body = b"--xyz\r\nContent-Disposition: form-data; name=input\r\n\r\nhi\r\n--xyz--\r\n"
    head = {"Authorization": f"Bearer {token}", "Content-Type": content_type, "Content-Length": str(len(body))}
    with _connect(daphne) as sock:
        sock.sendall(_head("POST", "/api/runs", head) + body)
        answer, _, payload = _response(sock)

    assert (answer, json.loads(payload)["error_code"]) == (415, "unsupported_media_type")


def test_it_lets_django_answer_a_multipart_form_without_a_boundary(daphne: Daphne) -> None:
    """Not Twisted, which parsed the body itself and answered a bare 400 with no body."""
    body = b"username=alice"
    # With a CSRF cookie, Django's CSRF check reads the form: the body is parsed, and refused.
    head = {"Content-Type": "multipart/form-data", "Content-Length": str(len(body)), "Cookie": "csrftoken=" + "t" * 32}
    with _connect(daphne) as sock:
        sock.sendall(_head("POST", "/accounts/login/", head) + body)
        answer, headers, page = _response(sock)

    assert answer == 400
    assert headers["content-type"].startswith("text/html") and b"</html>" in page.lower()


def test_it_cuts_a_chunked_body_at_the_cap_without_growing(daphne: Daphne, token: str) -> None:
    assert daphne.process is not None
    before = _status(daphne.process.pid, "VmRSS")
    chunk = b"x" * MB
    sent = 0
    with _connect(daphne) as sock:
        head = {"Authorization": f"Bearer {token}", "Transfer-Encoding": "chunked", "Content-Type": "application/json"}
        sock.sendall(_head("POST", "/api/runs", head))
        try:
            while sent < 200 * MB:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except OSError:
            pass  # the server hung up: what we want
        answer = _read_status_if_any(sock)

    assert sent < 200 * MB, "the server read a 200 MB chunked body to its end"
    assert answer in (413, None)
    assert _status(daphne.process.pid, "VmRSS") - before < 50 * 1024  # kB: well under what was sent


def test_it_does_not_grow_by_the_size_of_a_refused_body(daphne: Daphne) -> None:
    assert daphne.process is not None
    before = _status(daphne.process.pid, "VmRSS")
    chunk = b"x" * MB
    with _connect(daphne) as sock:
        sock.sendall(_head("POST", "/api/runs", {"Content-Length": str(300 * MB)}))
        try:
            for _ in range(300):
                sock.sendall(chunk)
        except OSError:
            pass  # refused and closed
        _read_status_if_any(sock)  # without the guard: once daphne has handed the body over
    assert _status(daphne.process.pid, "VmRSS") - before < 50 * 1024


def _read_status_if_any(sock: socket.socket) -> int | None:
    try:
        data = sock.recv(65536)
    except OSError:
        return None
    return int(data.split()[1]) if data.startswith(b"HTTP/1.1") else None


# -- item 5: streams cost no thread, and a user holds only so many -------------------------


def _open_stream(server: Daphne, token: str, path: str = "/api/events") -> socket.socket:
    """Open an SSE stream and wait for its `: live` line; return the socket."""
    sock = _connect(server)
    sock.sendall(_head("GET", path, {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}))
    data = b""
    while b": live" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the stream closed: {data!r}"
        assert data or chunk.startswith(b"HTTP/1.1 200"), chunk
        data += chunk
    return sock


def test_it_serves_many_streams_without_a_thread_each_and_caps_them_per_user(daphne: Daphne, token: str) -> None:
    assert daphne.process is not None
    streams = [_open_stream(daphne, token)]
    threads_with_one = _status(daphne.process.pid, "Threads")
    streams += [_open_stream(daphne, token) for _ in range(STREAMS_PER_USER - 1)]
    try:
        assert _status(daphne.process.pid, "Threads") - threads_with_one <= 2
        assert httpx.get(f"{daphne.url}/healthz", timeout=5).status_code == 200

        over = httpx.get(
            f"{daphne.url}/api/events",
            headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"},
            timeout=5,
        )
        assert over.status_code == 429
        assert over.json()["error_code"] == "too_many_streams"

        streams.pop().close()  # a slot comes back when a client goes away
        streams.append(wait_for(lambda: _try_stream(daphne, token), what="a freed slot"))
    finally:
        for sock in streams:
            sock.close()


def _try_stream(server: Daphne, token: str) -> socket.socket | None:
    try:
        return _open_stream(server, token)
    except AssertionError:
        return None


# -- item 6: a stream ends when its viewer's access does -----------------------------------


def _ends_with_access_ended(sock: socket.socket) -> bool:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if b"event: access_ended" in data:
            return True
    return False


def _revoke(user: User, token: str) -> None:
    services.token_revoke(prefix=token)


def _deactivate(user: User, token: str) -> None:
    user.is_active = False
    user.save()  # what the admin's user form does


def _remove_role(user: User, token: str) -> None:
    user.groups.remove(Group.objects.get(name="reviewer"))


@pytest.mark.parametrize("end_access", [_revoke, _deactivate, _remove_role])
def test_it_ends_a_tokens_stream_when_access_ends(
    daphne: Daphne, alice: User, token: str, end_access: Callable[[User, str], None]
) -> None:
    run = services.run_create(agent="support", input="hi", enqueue=False)
    with _open_stream(daphne, token, f"/api/runs/{run.id}/events") as sock:
        end_access(alice, token)
        assert _ends_with_access_ended(sock)


def _log_out(client: Client) -> None:
    client.logout()


def _set_password(client: Client) -> None:
    # As Django does: a session signed in with the old password is over.
    services.user_set_password(username="alice", password="a new long passphrase 7")


@pytest.mark.parametrize("end_session", [_log_out, _set_password])
def test_it_ends_a_sessions_stream_when_its_session_ends(
    daphne: Daphne, alice: User, end_session: Callable[[Client], None]
) -> None:
    client = Client()
    client.force_login(alice)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    with _connect(daphne) as sock:
        sock.sendall(_head("GET", "/api/events", {"Cookie": cookie, "Accept": "text/event-stream"}))
        data = b""
        while b": live" not in data:
            data += sock.recv(65536)
        end_session(client)
        assert _ends_with_access_ended(sock)


# -- many watchers: one frame, written to every socket ------------------------------------


def _open_inbox(server: Daphne, cookie: str) -> socket.socket:
    """Open /ws/inbox/ over a raw socket with the site's own Origin; return it once upgraded."""
    sock = _connect(server)
    host = urlsplit(server.url).netloc
    headers = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Version": "13",
        "Origin": server.url,
        "Cookie": cookie,
    }
    lines = ["GET /ws/inbox/ HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before the upgrade: {data!r}"
        data += chunk
    assert data.startswith(b"HTTP/1.1 101"), data
    assert data.endswith(b"\r\n\r\n"), "nothing is pushed before a pause"
    return sock


def _text_frame(sock: socket.socket) -> bytes:
    """Read one whole websocket frame the server sent; return its payload (it must be unmasked text)."""
    data = b""
    while len(data) < 2 or len(data) < _frame_size(data):
        chunk = sock.recv(65536)
        assert chunk, "closed"
        data += chunk
    assert data[0] == 0x81, f"not one final text frame: {data[:2]!r}"  # FIN + text, no fragments
    assert not data[1] & 0x80, "a server frame must not be masked"
    assert len(data) == _frame_size(data), "one frame: the card and the count together"
    return data[_header(data) : _frame_size(data)]


def _header(data: bytes) -> int:
    return {126: 4, 127: 10}.get(data[1] & 0x7F, 2)


def _frame_size(data: bytes) -> int:
    length = data[1] & 0x7F
    if length == 126:
        length = int.from_bytes(data[2:4]) if len(data) >= 4 else 1 << 30
    elif length == 127:
        length = int.from_bytes(data[2:10]) if len(data) >= 10 else 1 << 30
    return _header(data) + length


def test_it_writes_each_new_card_to_every_open_inbox_over_daphne(daphne: Daphne, alice: User, bob: User) -> None:
    cookies = []
    for user in (alice, alice, bob):
        client = Client()
        client.force_login(user)
        cookies.append(f"sessionid={client.cookies['sessionid'].value}")
    sockets = [_open_inbox(daphne, cookie) for cookie in cookies]
    try:
        run = flows.start("Refund order A1001 for 25.00 USD")
        [approval] = flows.pending(run)
        payloads = [_text_frame(sock) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    for payload in payloads:
        html = payload.decode()  # valid UTF-8, as a text frame must be
        assert f'id="card-{approval.id}"' in html
        assert 'data-count="1"' in html
    assert payloads[0] == payloads[1]  # one reviewer's two inboxes: the same frame


def test_it_keeps_daphnes_access_log_without_twisteds_copy_of_each_line(tmp_path: Path) -> None:
    # At -v 2 daphne sends Twisted's log to Python logging: a line Twisted formatted would show.
    server = Daphne(log=tmp_path / "daphne.log", env=child_env())
    server.args[-1:-1] = ["-v", "2"]
    server.start()
    try:
        server.wait_ready()
        response = httpx.get(f"{server.url}/healthz?probe=access-log", headers={"User-Agent": "access-log-probe"})
        assert response.status_code == 200
        wait_for(lambda: "probe=access-log" in server.log_path.read_text(), what="daphne's access line")
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert log.count("probe=access-log") == 1, log[-3000:]  # daphne's own line, once
    assert "access-log-probe" not in log  # Twisted's combined format carries the user agent


# -- many approval streams: each live frame written straight to every connection ----------


def _chunks(sock: socket.socket, data: bytes, until: Callable[[bytes], bool]) -> tuple[bytes, bytes]:
    """Read a chunked body until `until(body so far)`; return (body, bytes left over). Each chunk must be whole."""
    body = b""
    while not until(body):
        while b"\r\n" not in data:
            more = sock.recv(65536)
            assert more, f"closed: {body!r}"
            data += more
        size_text, _, data = data.partition(b"\r\n")
        size = int(size_text, 16)
        assert size > 0, "the stream ended"
        while len(data) < size + 2:
            more = sock.recv(65536)
            assert more, "closed inside a chunk"
            data += more
        assert data[size : size + 2] == b"\r\n", f"a chunk of {size} bytes is not followed by CRLF"
        body, data = body + data[:size], data[size + 2 :]
    return body, data


def _approval_stream(
    server: Daphne, token: str, last_event_id: str | None = None
) -> tuple[socket.socket, bytes, bytes]:
    """Open /api/events (chunked, as an HTTP/1.1 stream is); return the socket, the replay, and what followed `: live`."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    sock = _connect(server)
    sock.sendall(_head("GET", "/api/events", headers))
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower(), head
    body, rest = _chunks(sock, rest, lambda body: b": live\n\n" in body)
    replayed, _, live = body.partition(b": live\n\n")
    return sock, replayed, live + rest


def _frames_of(body: bytes) -> list[dict[str, object]]:
    frames = []
    for text in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in text.splitlines() if not line.startswith(":"))
        if "data" in fields:
            frames.append({"id": fields["id"], "event": fields["event"], **json.loads(fields["data"])})
    return frames


def test_it_writes_each_approval_event_once_to_every_open_stream_in_order(daphne: Daphne, token: str) -> None:
    streams = [_approval_stream(daphne, token) for _ in range(3)]
    try:
        run = flows.start("Refund order A1001 for 25.00 USD")
        [approval] = flows.pending(run)
        flows.decide(approval, "rejected", note="not this one")
        bodies = []
        for sock, replayed, rest in streams:
            assert replayed == b""  # nothing before the stream opened
            body, _ = _chunks(sock, rest, lambda body: b"event: approval_decided" in body)
            bodies.append(body)
    finally:
        for sock, _, _ in streams:
            sock.close()
    assert bodies[0] == bodies[1] == bodies[2]  # the same bytes, each frame once, in the order published
    frames = _frames_of(bodies[0])
    assert [frame["event"] for frame in frames] == ["approval_required", "approval_decided"]
    assert all(frame["run_id"] == run.id for frame in frames)
    required = str(frames[0]["id"])  # a cursor naming the first event

    # A stream opened again after the first frame replays the second from the table, once, then goes live.
    sock, replayed, _ = _approval_stream(daphne, token, last_event_id=required)
    sock.close()
    assert [(frame["event"], frame["seq"]) for frame in _frames_of(replayed)] == [
        (frame["event"], frame["seq"]) for frame in frames[1:]
    ]
