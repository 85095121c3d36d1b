"""The site's process commands: `agentfast dev` (make run), its login, and the embedded Redis."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured

from agents import services
from dashboard import cli, processes
from tests.conftest import child_env, wait_for
from tests.support.processes import ROOT, CliServe, free_port


def test_it_creates_the_admin_login_once_and_keeps_it_private(db, tmp_path):
    login_file = tmp_path / "login.txt"

    line = processes.dev_login(login_file)

    username, password = login_file.read_text().split()
    assert line == f"login: {username} / {password}" and username == "admin"
    assert User.objects.get(username="admin").check_password(password)
    assert login_file.stat().st_mode & 0o777 == 0o600
    assert processes.dev_login(login_file) == line


@pytest.mark.parametrize("login_text", [None, "admin not-the-password\n"], ids=["missing", "stale"])
def test_it_never_deletes_or_changes_an_existing_admin(db, tmp_path, login_text):
    admin, _ = services.user_create(username="admin", role="admin", password="chosen-by-a-person")
    _, token = services.token_create(username="admin", name="ci")
    login_file = tmp_path / "login.txt"
    if login_text is not None:
        login_file.write_text(login_text)

    line = processes.dev_login(login_file)

    assert "agentfast users password admin" in line and "chosen-by-a-person" not in line
    kept = User.objects.get(username="admin")
    assert kept.pk == admin.pk and kept.check_password("chosen-by-a-person")
    assert services.token_authenticate(token) == kept


def test_it_sets_a_password_through_the_cli_running_the_validators(db, capsys, alice):
    from dashboard import cli

    assert cli.main(["users", "password", "alice", "--password", "short"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("agentfast: ") and "too short" in err and err.count("\n") == 1
    assert User.objects.get(pk=alice.pk).check_password("alice-password")

    assert cli.main(["users", "password", "alice", "--password", "a long enough passphrase"]) == 0
    assert User.objects.get(pk=alice.pk).check_password("a long enough passphrase")
    assert cli.main(["users", "password", "nobody", "--password", "a long enough passphrase"]) == 1


def test_it_keeps_the_socket_of_a_deep_var_folder_where_only_this_user_can_reach_it(tmp_path, monkeypatch):
    import stat
    import tempfile

    shared = tmp_path / "tmp"
    shared.mkdir(mode=0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))  # the machine's /tmp, where anyone may create files
    deep = tmp_path / ("deep" * 30)

    sock = processes.socket_path(deep)

    # In the shared folder itself, another user could listen on the name first and be taken for our Redis.
    assert sock.parent != shared and sock.parent.parent == shared
    info = sock.parent.stat()
    assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
    assert processes.socket_path(deep) == sock

    os.chown(sock.parent, 65534, 65534)  # someone else made the folder first
    with pytest.raises(ImproperlyConfigured, match="is not this user's"):
        processes.socket_path(deep)


def test_it_pings_and_shuts_down_the_embedded_redis(tmp_path):
    sock = processes.socket_path(tmp_path)
    server = processes.start(sock, workdir=tmp_path, daemonize=False)
    try:
        assert processes.is_up(sock)
        processes.stop(sock)
        assert server is not None and server.wait(timeout=10) == 0
        assert not processes.is_up(sock)
    finally:
        if server is not None and server.poll() is None:
            server.kill()


def _dev_env(var_dir: Path, port: int) -> dict[str, str]:
    """The environment of `make run` on a fresh machine, with REDIS_URL set but empty."""
    env = {
        k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "AGENTFAST_TEST_VAR_DIR", "AGENTFAST_CONFIG"}
    }
    env.update(
        DJANGO_SETTINGS_MODULE="dashboard.settings",
        REDIS_URL="",
        AGENTFAST_VAR_DIR=str(var_dir),
        AGENTFAST_PORT=str(port),
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


def _start(argv: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a process of the project in a process group of its own, its output in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop_dev(dev: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM `dev` (honcho stops its children); SIGKILL whatever is left of the groups it started."""
    if dev.poll() is None:
        os.killpg(dev.pid, signal.SIGTERM)
        try:
            dev.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
            dev.wait(timeout=10)
    for pid in re.findall(r"started \(pid=(\d+)\)", log.read_text(errors="replace")):
        try:
            os.killpg(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.integration
def test_it_runs_make_run_with_an_empty_redis_url_and_announces_a_working_login(tmp_path):
    """`agentfast dev` with REDIS_URL="": the embedded Redis answers, the web answers, the printed login works."""
    var_dir, port, log = tmp_path / "var", free_port(), tmp_path / "dev.log"
    dev = _start([sys.executable, "-m", "dashboard.cli", "dev"], cwd=ROOT, env=_dev_env(var_dir, port), log=log)
    try:
        wait_for(lambda: "agentfast is ready on" in log.read_text(), timeout=180, what="agentfast dev to announce")
        username, password = re.search(r"login: (\S+) / (\S+)", log.read_text()).groups()

        assert redis.Redis(unix_socket_path=str(processes.socket_path(var_dir))).ping()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as web:
            assert web.get("/healthz").status_code == 200
            web.get("/accounts/login/")
            login = {"username": username, "password": password, "csrfmiddlewaretoken": web.cookies["csrftoken"]}
            assert web.post("/accounts/login/", data=login).headers.get("location") == "/"
            assert web.get("/").status_code == 200
    finally:
        _stop_dev(dev, log)
        processes.stop(processes.socket_path(var_dir))


@pytest.mark.parametrize("value", ["abc", "0", "65536", "-1", "٣"])
def test_it_refuses_a_port_that_is_none_and_names_where_it_came_from(db, value, monkeypatch, capsys):
    with pytest.raises(argparse.ArgumentTypeError, match="is not a port number"):
        processes.port_number(value)

    monkeypatch.setenv("AGENTFAST_PORT", value)
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve"])
    assert exited.value.code == 2
    assert f"argument --port: {value!r} is not a port number (1 to 65535)" in capsys.readouterr().err
    # Only the command that listens cares: the others still run.
    assert cli.main(["runs", "list"]) == 0


def test_it_reads_a_port_with_spaces_around_it():
    assert processes.port_number(" 8321 ") == 8321


@pytest.mark.parametrize(("value", "threads"), [("", "100"), (" 8 ", "8"), ("auto", "auto")])
def test_it_takes_an_empty_worker_concurrency_as_unset(monkeypatch, value, threads):
    monkeypatch.setenv("AGENTFAST_WORKER_CONCURRENCY", value)
    assert processes._worker_pool([]) == ["--pool=threads", f"--concurrency={threads}"]


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "0", "00", "²", "1001", "9" * 5000])
def test_it_refuses_a_worker_concurrency_that_is_none_naming_the_variable(monkeypatch, value):
    from agents.cli.output import CliError

    monkeypatch.setenv("AGENTFAST_WORKER_CONCURRENCY", value)
    with pytest.raises(CliError) as refused:  # before celery starts: the CLI prints it as one line
        processes._worker_pool([])
    assert str(refused.value).startswith(f"AGENTFAST_WORKER_CONCURRENCY: {value!r} is not")


def test_it_runs_the_worker_on_threads_unless_the_arguments_choose(monkeypatch):
    monkeypatch.delenv("AGENTFAST_WORKER_CONCURRENCY", raising=False)
    assert processes._worker_pool([]) == ["--pool=threads", "--concurrency=100"]
    assert processes._worker_pool(["--concurrency=4"]) == ["--pool=threads"]
    assert processes._worker_pool(["-P", "solo", "-c", "1"]) == []

    monkeypatch.setenv("AGENTFAST_WORKER_CONCURRENCY", "200")
    assert processes._worker_pool(["--pool=prefork"]) == ["--concurrency=200"]


@pytest.mark.integration
def test_beat_keeps_its_schedule_in_the_state_folder_whatever_folder_it_starts_in(tmp_path):
    """`celery -A dashboard beat` as the README starts it: in a service's folder, not the checkout."""
    var_dir, elsewhere, log = tmp_path / "var", tmp_path / "service", tmp_path / "beat.log"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTFAST_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="dashboard.settings",
        AGENTFAST_VAR_DIR=str(var_dir),
        REDIS_URL=settings.REDIS_URL,  # the suite's own Redis
        PYTHONPATH=str(ROOT),
    )
    beat = _start(
        [sys.executable, "-m", "celery", "-A", "dashboard", "beat", "--loglevel=INFO"], cwd=elsewhere, env=env, log=log
    )
    try:
        wait_for(lambda: "Sending due task" in log.read_text(), timeout=60, what="beat to send its sweep")
    finally:
        os.killpg(beat.pid, signal.SIGTERM)
        beat.wait(timeout=30)

    assert [p.name for p in var_dir.glob("celerybeat-schedule*")] and not list(elsewhere.iterdir())


def _open_files(pid: int) -> tuple[int, int]:
    """Return a process's soft and hard open-file limits, as /proc shows them."""
    line = next(line for line in Path(f"/proc/{pid}/limits").read_text().splitlines() if "open files" in line)
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/sys/net/core/somaxconn").exists(), reason="reads the kernel's cap from /proc")
@pytest.mark.skipif(shutil.which("ss") is None, reason="reads the listening socket's backlog with ss (iproute2)")
def test_serve_queues_a_crowd_of_connections_rather_than_dropping_their_handshakes(transactional_db, tmp_path):
    # Twisted listens with a backlog of 50: every live inbox reconnecting after a deploy past
    # the 50 not yet accepted had its handshake dropped, and tried again seconds later.
    server = CliServe(log=tmp_path / "serve.log", env=child_env())
    server.start()
    try:
        server.wait_ready(timeout=30)
        listening = subprocess.run(
            ["ss", "-ltnH", f"sport = :{server.port}"], capture_output=True, text=True, check=True
        ).stdout.split()
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        assert int(listening[2]) == min(processes.LISTEN_BACKLOG, somaxconn)  # State, Recv-Q, Send-Q: the backlog
    finally:
        server.stop()


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="reads the limits from Linux's /proc")
def test_serve_raises_its_open_file_limit_so_hundreds_of_open_inboxes_do_not_shut_it_out(transactional_db, tmp_path):
    """Started under the low soft limit most systems give a service (1024; 256 here) below a high hard one.

    Every open connection holds a file: at its soft limit the web process refused new ones, a
    probe included, and could open no database connection.
    """
    server = CliServe(
        log=tmp_path / "serve.log", env=child_env(), wrap=("sh", "-c", 'ulimit -Sn 256 && exec "$@"', "sh")
    )
    server.start()
    idle: list[socket.socket] = []
    try:
        server.wait_ready(timeout=30)
        assert server.process is not None
        soft, hard = _open_files(server.process.pid)
        assert soft == hard > 256

        for _ in range(300):  # inboxes and streams left open: more than the limit it was started with
            connection = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and not finished
            idle.append(connection)
        with httpx.Client(base_url=server.url, timeout=10) as web:
            assert web.get("/healthz").json() == {"ok": True, "redis": True}
        assert "may open" not in server.log_tail()
    finally:
        for connection in idle:
            connection.close()
        server.stop()


@pytest.mark.integration
def test_serve_warns_of_an_open_file_limit_it_cannot_raise_far(transactional_db, tmp_path):
    server = CliServe(
        log=tmp_path / "serve.log", env=child_env(), wrap=("sh", "-c", 'ulimit -n 512 && exec "$@"', "sh")
    )
    server.start()
    try:
        server.wait_ready(timeout=30)
        assert (
            "agentfast: warning: this process may open 512 files at most: each live inbox, SSE stream, database and "
            "Redis connection takes one, so connections past about 512 are refused; raise the hard limit"
        ) in server.log_tail()
    finally:
        server.stop()
