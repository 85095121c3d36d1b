"""Secure defaults: settings from the environment, private files, headers, error pages, client addresses."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.template.loader import render_to_string
from django.test import Client

from agents import services
from agents.models import Approval, AuditEntry
from tests.conftest import ROOT

_SHOW = """
import json, os, stat, sys
from django.conf import settings
from django.db import connection
db = settings.DATABASES["default"]
modes = {}
if db["ENGINE"].endswith("sqlite3"):
    with connection.cursor() as cursor:  # a write makes SQLite create its -wal and -shm files
        cursor.execute("CREATE TABLE IF NOT EXISTS probe (x)")
        cursor.execute("INSERT INTO probe VALUES (1)")
    # While the connection is open: SQLite removes the -wal file when the last one closes.
    for suffix in ("", "-wal", "-shm"):
        modes[suffix] = stat.S_IMODE(os.stat(f"{db['NAME']}{suffix}").st_mode)
json.dump({
    "DEBUG": settings.DEBUG,
    "SECRET_KEY": settings.SECRET_KEY,
    "REDIS_URL": settings.REDIS_URL,
    "REDIS_IS_EMBEDDED": settings.REDIS_IS_EMBEDDED,
    "ENGINE": db["ENGINE"],
    "NAME": str(db["NAME"]),
    "CONN_MAX_AGE": db["CONN_MAX_AGE"],
    "POOL": db.get("OPTIONS", {}).get("pool"),
    "SERVER_SIDE_BINDING": db.get("OPTIONS", {}).get("server_side_binding"),
    "PREPARE_THRESHOLD": db.get("OPTIONS", {}).get("prepare_threshold"),
    "TRUSTED": settings.AGENTFAST_TRUSTED_PROXIES,
    "SESSION_COOKIE_SECURE": settings.SESSION_COOKIE_SECURE,
    "SLACK_SIGNING_SECRET": settings.AGENTFAST_SLACK_SIGNING_SECRET,
    "METRICS_TOKEN": settings.AGENTFAST_METRICS_TOKEN,
    "BASE_URL": settings.AGENTFAST_BASE_URL,
    "MODES": modes,
}, sys.stdout)
"""


def settings_of(var_dir: Path, *, read_only: bool = False, **env: str) -> subprocess.CompletedProcess[str]:
    """Import the production settings in a fresh process, with only the given variables set.

    The settings alone, without django.setup(): they make the var folder and its files private
    themselves, and loading every app would cost each test a second more. `read_only` mounts
    the var folder read-only for that process alone, as a container's read-only file system does.
    """
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "AGENTFAST_", "REDIS_", "DATABASE_"))}
    clean.update(DJANGO_SETTINGS_MODULE="dashboard.settings", AGENTFAST_VAR_DIR=str(var_dir), PYTHONPATH=str(ROOT))
    clean.update(env)
    return subprocess.run(
        [*(_read_only_mount(var_dir) if read_only else []), sys.executable, "-c", _SHOW],
        cwd=ROOT,
        check=False,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _read_only_mount(folder: Path) -> list[str]:
    """Return the command prefix that runs a command with `folder` mounted read-only (a mount namespace of its own)."""
    if subprocess.run(["unshare", "--map-root-user", "--mount", "true"], check=False).returncode:
        pytest.skip("this kernel lets no process mount a folder read-only for itself")
    mount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "--map-root-user", "--mount", "sh", "-c", mount, str(folder)]


def loaded(var_dir: Path, **env: str) -> dict:
    done = settings_of(var_dir, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- settings (item 9, 12, 24; django-environ) -------------------------------------------


def test_it_keeps_debug_off_unless_a_developer_opts_in(tmp_path):
    assert loaded(tmp_path / "var")["DEBUG"] is False
    assert loaded(tmp_path / "var", DJANGO_DEBUG="1")["DEBUG"] is True


def test_it_generates_a_private_secret_key_once_and_reuses_it(tmp_path):
    var = tmp_path / "var"

    first = loaded(var)["SECRET_KEY"]
    again = loaded(var)["SECRET_KEY"]

    key_file = var / "secret_key"
    assert first == again == key_file.read_text().strip()
    assert len(first) >= 50 and "insecure" not in first
    assert mode(key_file) == 0o600
    assert [p.name for p in var.iterdir() if p.name.startswith(".secret_key")] == []  # no draft left
    assert loaded(var, DJANGO_SECRET_KEY="from-the-environment")["SECRET_KEY"] == "from-the-environment"


@pytest.mark.parametrize("held", ["", "changeme\n"], ids=["empty", "short"])
def test_it_stops_at_start_with_a_key_file_that_holds_no_key(tmp_path, held):
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    (var / "secret_key").write_text(held)

    refused = settings_of(var)

    assert refused.returncode != 0
    line = refused.stderr.splitlines()[-1]
    assert (
        f"DJANGO_SECRET_KEY: unset, and the key file {var / 'secret_key'} holds {len(held.strip())} characters" in line
    )


def test_it_warns_at_start_of_a_secret_key_anyone_could_guess(db, settings, capsys):
    from dashboard.processes import _say_configuration_problems

    settings.SECRET_KEY = "changeme-in-production"
    _say_configuration_problems()
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("agentfast: warning: DJANGO_SECRET_KEY is short or plain (under 50 characters")

    settings.SECRET_KEY = "kP3v" * 13  # 52 characters, yet 4 different ones
    _say_configuration_problems()
    assert "DJANGO_SECRET_KEY is short or plain" in capsys.readouterr().err


def test_it_warns_at_start_when_another_process_signs_with_a_different_key(db, settings, capsys):
    """Two machines with DJANGO_SECRET_KEY unset each make their own var/secret_key: one refuses what the other signs."""
    from dashboard.processes import _say_configuration_problems

    settings.SECRET_KEY = "first machine " + "x7Qp2Lm9Zt4Rv8Ks" * 4
    _say_configuration_problems()  # the worker on one machine
    _say_configuration_problems()  # the web process beside it
    assert capsys.readouterr().err == ""

    settings.SECRET_KEY = "other machine " + "a1Bc3De5Fg7Hi9Jk" * 4
    _say_configuration_problems()  # a worker on another machine, sharing the database and Redis
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("agentfast: warning: another agentfast process sharing this Redis started with a different")
    assert settings.SECRET_KEY not in line

    _say_configuration_problems()  # after a deliberate change of key, said once
    assert capsys.readouterr().err == ""


def test_it_takes_a_blank_secret_as_unset_never_as_the_key(tmp_path):
    var = tmp_path / "var"

    shown = loaded(var, DJANGO_SECRET_KEY="   ", SLACK_SIGNING_SECRET=" \t", AGENTFAST_METRICS_TOKEN=" ")

    # A key of spaces (an env file's `DJANGO_SECRET_KEY= `) is one anyone can guess: generated instead.
    assert shown["SECRET_KEY"] == (var / "secret_key").read_text().strip() and len(shown["SECRET_KEY"]) >= 50
    assert shown["SLACK_SIGNING_SECRET"] == ""  # so no Slack request verifies, rather than any signed with spaces
    assert shown["METRICS_TOKEN"] == ""  # so only an admin's token scrapes


@pytest.mark.parametrize(("value", "read"), [("1", True), ("True", True), (" yes ", True), ("off", False), ("", False)])
def test_it_reads_a_switch_in_the_usual_spellings(tmp_path, value, read):
    assert loaded(tmp_path / "var", DJANGO_SESSION_COOKIE_SECURE=value)["SESSION_COOKIE_SECURE"] is read


def test_it_keeps_the_base_url_of_links_without_a_trailing_slash(tmp_path):
    shown = loaded(tmp_path / "var", AGENTFAST_BASE_URL=" https://agentfast.example.com/ ")
    assert shown["BASE_URL"] == "https://agentfast.example.com"


def test_it_keeps_var_and_the_sqlite_files_private(tmp_path):
    var = tmp_path / "var"

    shown = loaded(var)

    assert Path(shown["NAME"]).parent == var and mode(var) == 0o700
    assert shown["MODES"] == {"": 0o600, "-wal": 0o600, "-shm": 0o600}


def test_it_tightens_an_existing_world_readable_var(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    var.chmod(0o755)
    old = var / "agentfast.sqlite3"
    old.touch()
    old.chmod(0o644)

    loaded(var)

    assert mode(var) == 0o700 and mode(old) == 0o600


# The production settings of the README: nothing of the state but the schedule lives in var/.
_SERVER_STATE = {"DATABASE_URL": "postgres://app@db.internal/agentfast", "REDIS_URL": "redis://cache.internal:6379/0"}


def test_it_starts_on_a_read_only_var_that_is_already_private(tmp_path):
    var = tmp_path / "var"
    key = loaded(var)["SECRET_KEY"]  # made when the image was built (collectstatic, migrate)

    shown = loaded_read_only(var, **_SERVER_STATE)
    assert shown["SECRET_KEY"] == key and shown["ENGINE"].endswith("postgresql")
    assert loaded_read_only(var, DJANGO_SECRET_KEY="from-the-environment", **_SERVER_STATE)["SECRET_KEY"] == (
        "from-the-environment"
    )


def test_it_stops_in_one_line_on_a_read_only_var_it_cannot_make_private_or_keep_a_key_in(tmp_path):
    open_to_all, empty = tmp_path / "open", tmp_path / "empty"
    open_to_all.mkdir(mode=0o755)
    open_to_all.chmod(0o755)
    empty.mkdir(mode=0o700)

    refused = settings_of(open_to_all, read_only=True, DJANGO_SECRET_KEY="from-the-environment", **_SERVER_STATE)
    keyless = settings_of(empty, read_only=True, **_SERVER_STATE)

    for done, says in ((refused, "AGENTFAST_VAR_DIR: "), (keyless, "DJANGO_SECRET_KEY: ")):
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode != 0 and last.startswith(f"django.core.exceptions.ImproperlyConfigured: {says}"), (
            done.stderr
        )
        assert "Read-only file system" in last
    assert mode(open_to_all) == 0o755 and list(empty.iterdir()) == []


def loaded_read_only(var_dir: Path, **env: str) -> dict:
    done = settings_of(var_dir, read_only=True, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("value", [None, "", "  "])
def test_it_takes_an_unset_or_empty_redis_url_as_the_embedded_redis(tmp_path, value):
    env = {} if value is None else {"REDIS_URL": value}

    shown = loaded(tmp_path / "var", **env)

    assert shown["REDIS_IS_EMBEDDED"] is True and shown["REDIS_URL"].startswith("unix://")


def test_it_reads_redis_and_database_urls_from_the_environment(tmp_path):
    shown = loaded(
        tmp_path / "var",
        REDIS_URL="redis://cache:6379/2",
        DATABASE_URL="postgres://app:s%40cret@db.internal:6432/agentfast",
        AGENTFAST_TRUSTED_PROXIES="10.0.0.0/8, 192.168.1.1",
    )

    assert (shown["REDIS_IS_EMBEDDED"], shown["REDIS_URL"]) == (False, "redis://cache:6379/2")
    # A bounded pool per process holds the connections, not each thread (issue 12).
    assert (shown["ENGINE"], shown["NAME"], shown["CONN_MAX_AGE"]) == ("django.db.backends.postgresql", "agentfast", 0)
    assert shown["POOL"]["max_size"] == 20  # a thread holds one only between model calls
    assert shown["TRUSTED"] == ["10.0.0.0/8", "192.168.1.1"]


def test_it_takes_a_log_level_in_any_case(tmp_path):
    assert settings_of(tmp_path / "var", AGENTFAST_LOG_LEVEL="debug").returncode == 0


def test_it_opens_a_pool_of_one_connection_when_told_to(tmp_path):
    shown = loaded(tmp_path / "var", DATABASE_URL="postgres://app@db.internal/agentfast", AGENTFAST_DB_POOL="1")

    assert (shown["POOL"]["min_size"], shown["POOL"]["max_size"]) == (1, 1)  # psycopg_pool refuses min > max


def test_it_keeps_a_connection_per_thread_when_the_pool_is_turned_off(tmp_path):
    shown = loaded(tmp_path / "var", DATABASE_URL="postgres://app@db.internal/agentfast", AGENTFAST_DB_POOL="0")

    assert (shown["CONN_MAX_AGE"], shown["POOL"]) == (60, None)


@pytest.mark.parametrize(
    ("pool", "prepared", "binds_on_the_server"),
    [("20", "", False), ("20", "on", True), ("0", "on", True), ("20", "off", False)],
)
def test_it_binds_parameters_on_the_server_so_that_postgresql_prepares_repeated_statements_when_told_to(
    tmp_path, pool, prepared, binds_on_the_server
):
    env = {"DATABASE_URL": "postgres://app@db.internal/agentfast", "AGENTFAST_DB_POOL": pool}
    shown = loaded(tmp_path / "var", **env, **({"AGENTFAST_DB_PREPARED": prepared} if prepared else {}))

    assert shown["SERVER_SIDE_BINDING"] is binds_on_the_server
    # from a statement's second run: at psycopg's default (its sixth) the engine's round trip gained nothing
    assert shown["PREPARE_THRESHOLD"] == (1 if binds_on_the_server else None)


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("AGENTFAST_TRUSTED_PROXIES", "10.0.0.0/8,proxy.local", "'proxy.local' is not an IP address"),
        ("DJANGO_SECURE_PROXY_SSL_HEADER", "https", "is not like 'X-Forwarded-Proto: https'"),
        ("DATABASE_URL", "mysql://db/x", "unsupported database"),
        ("DATABASE_URL", "garbage", "not a database URL"),
        ("DATABASE_URL", "postgres://", "names no database"),
        ("DATABASE_URL", "postgres://app:s3cret@db.internal:5432/", "names no database"),
        ("DATABASE_URL", "postgres://app@db.internal:port/agentfast", "could not be cast to integer"),
        ("DATABASE_URL", "sqlite://", "names no SQLite file"),
        ("AGENTFAST_DB_POOL", "twenty", "'twenty' is not a whole number"),
        ("AGENTFAST_DB_PREPARED", "sometimes", "'sometimes' is not on or off"),
        ("AGENTFAST_STREAMS_PER_USER", "-3", "'-3' is out of range (at least 1)"),
        # a lease or sweep of NaN or 0 seconds would hand every run to the sweeper at once
        ("AGENTFAST_LEASE_SECONDS", "nan", "'nan' is out of range (a finite number of at least 1)"),
        ("AGENTFAST_SWEEP_SECONDS", "0", "'0' is out of range (a finite number of at least 0.1)"),
        # a typo for 1e9 would spin beat; a lease under a second is lost between its renewals
        ("AGENTFAST_SWEEP_SECONDS", "1e-9", "'1e-9' is out of range (a finite number of at least 0.1)"),
        ("AGENTFAST_LEASE_SECONDS", "0.5", "'0.5' is out of range (a finite number of at least 1)"),
        ("AGENTFAST_LOGIN_COOLOFF_MINUTES", "soon", "'soon' is not a number"),
        ("REDIS_URL", "localhost:6379", "'localhost:6379' is not a Redis URL"),
        ("AGENTFAST_CHANNEL_HOSTS", "redis://a:6379, b:6379", "'b:6379' is not a Redis URL"),
        ("OPENAI_TIMEOUT", "nan", "'nan' is out of range (a finite number of at least 0.1)"),
        ("OPENAI_MAX_RETRIES", "-1", "'-1' is out of range (at least 0)"),
        ("AGENTFAST_LOG_LEVEL", "verbose", "'verbose' is not a log level (DEBUG, INFO, WARNING, ERROR or CRITICAL)"),
        # a mistyped switch read as off would send session cookies in the clear, say nothing of it
        ("DJANGO_SESSION_COOKIE_SECURE", "ture", "'ture' is not on or off"),
        ("DJANGO_CSRF_COOKIE_SECURE", "secure", "'secure' is not on or off"),
        ("DJANGO_SECURE_SSL_REDIRECT", "enabled", "'enabled' is not on or off"),
        ("DJANGO_SECURE_HSTS_PRELOAD", "preload", "'preload' is not on or off"),
        ("DJANGO_DEBUG", "maybe", "'maybe' is not on or off"),
        # every link in mails and Slack messages starts with it
        ("AGENTFAST_BASE_URL", "agentfast.example.com", "'agentfast.example.com' is not an http(s) URL"),
        ("AGENTFAST_BASE_URL", "https://", "'https://' is not an http(s) URL"),
    ],
)
def test_it_refuses_a_bad_setting_naming_it(tmp_path, variable, value, says):
    done = settings_of(tmp_path / "var", **{variable: value})

    assert done.returncode != 0 and variable in done.stderr and says in done.stderr


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("smtp://mailer:s3cret@mail.example.com:submission", "could not be cast to integer"),
        ("smtps://mailer:s3cret@mail.example.com:99999", "Port out of range"),
        ("smpt://mailer:s3cret@mail.example.com", "Invalid email schema"),
        ("mail.example.com", "Invalid email schema"),
    ],
)
def test_it_refuses_a_bad_email_url_in_a_line_naming_it_and_not_its_password(tmp_path, value, says):
    done = settings_of(tmp_path / "var", EMAIL_URL=value)

    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: EMAIL_URL: ") and says in last
    assert "s3cret" not in done.stderr


# -- error pages (item 9) -----------------------------------------------------------------


def test_it_answers_a_bad_host_with_a_small_branded_page(client):
    response = client.get("/", HTTP_HOST="evil.example")

    assert response.status_code == 400
    body = response.content.decode()
    assert "agentfast" in body and "Bad request" in body
    assert len(body) < 3000 and "SECRET" not in body and "settings" not in body.lower()


def test_it_shows_a_branded_not_found_page(client_for, alice):
    response = client_for(alice).get("/no/such/page")

    assert response.status_code == 404
    assert b"agentfast" in response.content and b"Not found" in response.content


def test_it_renders_the_server_error_page_without_any_context():
    body = render_to_string("500.html")

    assert "agentfast" in body and "Something went wrong" in body and "<script" not in body


# -- headers (item 13) -------------------------------------------------------------------


def csp(response: HttpResponse) -> dict[str, list[str]]:
    directives = [d.strip().split() for d in response["Content-Security-Policy"].split(";") if d.strip()]
    return {name: values for name, *values in directives}


def test_it_sends_a_content_security_policy_without_inline_script(client_for, alice):
    for response in (Client().get("/accounts/login/"), client_for(alice).get("/"), client_for(alice).get("/api/runs")):
        policy = csp(response)
        assert policy["script-src"] == ["'self'"]
        assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
        assert policy["base-uri"] == ["'self'"] and policy["form-action"] == ["'self'"]
        assert policy["img-src"] == ["'self'", "data:"]
        assert policy["connect-src"] == ["'self'", "ws://testserver"]


@pytest.mark.parametrize("secure", [False, True], ids=["http", "https"])
def test_it_sends_the_policy_django_csp_builds_and_leaves_a_customized_one_to_it(rf, secure, settings):
    from csp.middleware import CSPMiddleware

    from dashboard.middleware import ContentSecurityPolicyMiddleware

    settings.ALLOWED_HOSTS = ["agentfast.example.com"]
    middleware = ContentSecurityPolicyMiddleware(lambda request: HttpResponse())
    request = rf.get("/api/runs", HTTP_HOST="agentfast.example.com", secure=secure)
    ours = middleware.process_response(request, HttpResponse())["Content-Security-Policy"]
    theirs = CSPMiddleware.process_response(
        middleware, rf.get("/api/runs", HTTP_HOST="agentfast.example.com", secure=secure), HttpResponse()
    )

    assert ours == theirs["Content-Security-Policy"]
    assert f"{'wss' if secure else 'ws'}://agentfast.example.com" in ours
    customized = HttpResponse()
    customized._csp_update = {"img-src": ["https://img.example.com"]}  # what django-csp's @csp_update sets
    assert "https://img.example.com" in middleware.process_response(request, customized)["Content-Security-Policy"]
    exempt = HttpResponse()
    exempt._csp_exempt = True
    assert "Content-Security-Policy" not in middleware.process_response(request, exempt)


def test_it_serves_the_api_docs_with_no_inline_script(client_for, alice):
    response = client_for(alice).get("/api/docs")

    assert response.status_code == 200
    body = response.content.decode()
    # Every script is a file of ours or a JSON data block, which a CSP without 'unsafe-inline' allows.
    for chunk in body.split("<script")[1:]:
        tag = chunk.split(">", 1)[0]
        assert " src=" in tag or 'type="application/json"' in tag, tag


def test_it_forbids_caching_private_pages_and_every_api_answer(client_for, alice, approval):
    signed_in = client_for(alice)
    for url in ("/", f"/approvals/{approval.id}", "/runs", "/api/approvals", "/api/nothing-here"):
        assert "no-store" in signed_in.get(url)["Cache-Control"], url
    assert "no-store" in Client().get("/api/approvals")["Cache-Control"]  # a 401 too


def test_it_lets_static_files_be_cached(client):
    response = client.get("/static/css/app.css")

    assert response.status_code == 200 and "no-store" not in response.get("Cache-Control", "")


# -- where a decision came from (item 10) ----------------------------------------------


def decide_with(alice: User, approval: Approval, **meta: str) -> AuditEntry:
    token = services.token_create(username="alice")[1]
    response = Client().post(
        f"/api/approvals/{approval.id}/decide",
        data=json.dumps({"decision": "rejected", "note": "no"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
        **meta,
    )
    assert response.status_code == 200, response.content
    return AuditEntry.objects.get(approval_id=approval.id)


def test_it_ignores_a_forwarded_for_header_from_an_untrusted_peer(alice, approval):
    entry = decide_with(alice, approval, REMOTE_ADDR="198.51.100.7", HTTP_X_FORWARDED_FOR="10.9.9.9")

    assert entry.origin == "198.51.100.7"


def test_it_takes_the_nearest_untrusted_address_behind_trusted_proxies(alice, approval, settings):
    settings.AGENTFAST_TRUSTED_PROXIES = ["127.0.0.1", "10.0.0.0/8"]

    entry = decide_with(alice, approval, REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.9, 10.1.2.3")

    assert entry.origin == "203.0.113.9"  # 6.6.6.6 is what the client claimed: not believed


def test_it_does_not_believe_a_forwarded_hop_that_is_no_address(alice, approval, settings):
    settings.AGENTFAST_TRUSTED_PROXIES = ["127.0.0.1"]

    entry = decide_with(alice, approval, REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="x" * 300)

    assert entry.origin == "127.0.0.1"


@pytest.mark.parametrize(
    ("peer", "forwarded", "origin"),
    [
        ("::ffff:10.0.0.5", "203.0.113.9", "203.0.113.9"),  # the proxy, reaching a socket of both families
        ("::ffff:10.0.0.5", "6.6.6.6, ::ffff:203.0.113.9", "203.0.113.9"),
        ("::ffff:198.51.100.7", "10.9.9.9", "198.51.100.7"),  # anyone else, named as the IPv4 host it is
    ],
)
def test_it_reads_an_ipv4_peer_of_a_server_listening_on_ipv6_as_ipv4(
    alice, approval, settings, peer, forwarded, origin
):
    # `agentfast serve --host ::` takes IPv4 connections too, and names their peer ::ffff:a.b.c.d.
    settings.AGENTFAST_TRUSTED_PROXIES = ["10.0.0.5"]

    entry = decide_with(alice, approval, REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded)

    assert entry.origin == origin


# -- deciding for someone else (item 14) -------------------------------------------------


def decide_for(user: str, approval: Approval, decided_by: str) -> tuple[int, dict]:
    token = services.token_create(username=user)[1]
    response = Client().post(
        f"/api/approvals/{approval.id}/decide",
        data=json.dumps({"decision": "approved", "decided_by": decided_by, "auto_resume": False}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    return response.status_code, response.json()


@pytest.mark.parametrize("name", ["nobody", "ALICE", "dave"])
def test_it_refuses_and_audits_an_admin_deciding_for_someone_who_is_no_active_user(carol, alice, approval, name):
    User.objects.create_user(username="dave", password="dave-password", is_active=False)

    status, body = decide_for("carol", approval, name)

    assert status == 403 and (body["error_code"], body["field"]) == ("not_permitted", "decided_by")
    assert "no active user" in body["message"]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    entry = AuditEntry.objects.get(approval_id=approval.id)
    assert (entry.actor, entry.on_behalf_of, entry.outcome) == ("carol", name, "not_permitted")


@pytest.mark.parametrize("role", ["agent", None], ids=["agent", "no-role"])
def test_it_refuses_and_audits_an_admin_deciding_for_an_account_that_may_not_decide(carol, approval, role):
    if role is None:
        User.objects.create_user(username="vic", password="vic-password")
    else:
        services.user_create(username="vic", role=role)

    status, body = decide_for("carol", approval, "vic")

    assert status == 403 and (body["error_code"], body["field"]) == ("not_permitted", "decided_by")
    assert "may not decide" in body["message"]
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == (Approval.Status.PENDING, "")
    entry = AuditEntry.objects.get(approval_id=approval.id)
    assert (entry.actor, entry.on_behalf_of, entry.outcome) == ("carol", "vic", "not_permitted")


def test_it_lets_an_admin_record_a_decision_for_an_existing_user(carol, alice, approval):
    status, body = decide_for("carol", approval, "alice")

    assert status == 200 and body["decided_by"] == "alice"
    entry = AuditEntry.objects.get(approval_id=approval.id)
    assert (entry.actor, entry.on_behalf_of, entry.outcome) == ("carol", "alice", "decided")
