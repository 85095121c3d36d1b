"""The site's process commands: `agentfast dev` (make run), its login, and the embedded Redis."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from agents import services
from dashboard import processes


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
