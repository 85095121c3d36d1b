"""Settings given odd values: what an operator writes must mean what it says, or stop the process in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

_SHOW = """
import json, sys
import django
from django.conf import settings
django.setup()
from django.test import Client
page = Client().get("/accounts/login/", HTTP_HOST="localhost")
json.dump({
    "ALLOWED_HOSTS": settings.ALLOWED_HOSTS,
    "PROXY_SSL_HEADER": settings.SECURE_PROXY_SSL_HEADER,
    "VAR_DIR": str(settings.VAR_DIR),
    "CONFIG": str(settings.AGENTFAST_CONFIG),
    "LOGIN_PAGE": page.status_code,
}, sys.stdout)
"""


def _fresh(cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Set Django up in a fresh process started in `cwd`, with only these variables of ours set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "AGENTFAST_", "REDIS_", "DATABASE_"))}
    clean.update(DJANGO_SETTINGS_MODULE="dashboard.settings", PYTHONPATH=str(ROOT))
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-c", _SHOW], cwd=cwd, check=False, env=clean, capture_output=True, text=True, timeout=120
    )


def _shown(cwd: Path, **env: str) -> dict:
    done = _fresh(cwd, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_allowed_hosts_is_the_default_not_a_site_that_answers_400_to_everyone(tmp_path, value):
    # "An empty variable counts as unset" (README): `DJANGO_ALLOWED_HOSTS=` in an env file
    # emptied the list, and with DEBUG off Django refused every host: every page a 400.
    shown = _shown(tmp_path, AGENTFAST_VAR_DIR=str(tmp_path / "var"), DJANGO_ALLOWED_HOSTS=value)

    assert shown["ALLOWED_HOSTS"] == ["localhost", "127.0.0.1", "[::1]"]
    assert shown["LOGIN_PAGE"] == 200


@pytest.mark.parametrize(
    "value",
    [
        "https://agentfast.example.com",  # a URL where a host name belongs: never matches a Host header
        "agentfast.example.com agentfast-2.example.com",  # blanks where a comma belongs: one host of neither name
        "agentfast.example.com/",
    ],
)
def test_an_allowed_host_no_request_can_ever_match_is_refused_naming_the_variable(tmp_path, value):
    # Taken silently, the site answered 400 to every page at that name, and said nothing at start.
    done = _fresh(tmp_path, AGENTFAST_VAR_DIR=str(tmp_path / "var"), DJANGO_ALLOWED_HOSTS=value)

    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "DJANGO_ALLOWED_HOSTS" in last and "is not a host name" in last


def test_the_proxy_ssl_header_may_be_written_as_django_names_it(tmp_path):
    # Django's docs spell it ("HTTP_X_FORWARDED_PROTO", "https"); written so, it was read as the
    # header HTTP-X-Forwarded-Proto, which no proxy sends: no request was ever secure, and with
    # DJANGO_SECURE_SSL_REDIRECT=1 every page redirected to itself for ever.
    header = "HTTP_X_FORWARDED_PROTO: https"
    shown = _shown(tmp_path, AGENTFAST_VAR_DIR=str(tmp_path / "var"), DJANGO_SECURE_PROXY_SSL_HEADER=header)

    assert shown["PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


def test_a_blank_var_dir_is_the_default_not_a_folder_named_by_blanks(tmp_path):
    # An env file's `AGENTFAST_VAR_DIR= ` made a folder named " " wherever the process started,
    # with a new empty database and a new secret key in it: each process its own.
    shown = _shown(tmp_path, AGENTFAST_VAR_DIR=" ")

    assert shown["VAR_DIR"] == str(ROOT / "var")
    assert not (tmp_path / " ").exists()


def test_a_blank_config_path_is_the_default_file(tmp_path):
    # `AGENTFAST_CONFIG= ` named a file " " in the folder the process started in: every command stopped.
    shown = _shown(tmp_path, AGENTFAST_VAR_DIR=str(tmp_path / "var"), AGENTFAST_CONFIG="  ")

    assert shown["CONFIG"] == str(ROOT / "agentfast.yaml")


_SHOW_MAIL = """
import json, sys
from django.conf import settings
json.dump({name: getattr(settings, name, None) for name in (
    "EMAIL_BACKEND", "EMAIL_HOST", "EMAIL_PORT", "EMAIL_HOST_USER", "EMAIL_HOST_PASSWORD",
    "EMAIL_USE_TLS", "EMAIL_USE_SSL",
)}, sys.stdout)
"""


def _mail_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "AGENTFAST_", "REDIS_", "DATABASE_"))}
    clean = {k: v for k, v in clean.items() if not k.startswith("EMAIL_")}
    clean.update(DJANGO_SETTINGS_MODULE="dashboard.settings", PYTHONPATH=str(ROOT))
    clean.update(AGENTFAST_VAR_DIR=str(tmp_path / "var"))
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-c", _SHOW_MAIL], cwd=ROOT, check=False, env=clean, capture_output=True, text=True, timeout=60
    )


SMTP = "django.core.mail.backends.smtp.EmailBackend"


def test_the_usual_email_variables_beside_email_backend_are_all_read(tmp_path):
    # The settings take Django's usual EMAIL_BACKEND, EMAIL_HOST and EMAIL_PORT, but dropped the
    # user, the password and TLS written beside them without a word: every mail went out
    # unauthenticated over plain SMTP, which a submission server refuses (or reads in the clear).
    done = _mail_settings(
        tmp_path,
        EMAIL_BACKEND=SMTP,
        EMAIL_HOST="mail.example.com",
        EMAIL_PORT="587",
        EMAIL_HOST_USER="mailer",
        EMAIL_HOST_PASSWORD="s3cret",
        EMAIL_USE_TLS="1",
    )

    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert (shown["EMAIL_HOST"], shown["EMAIL_PORT"]) == ("mail.example.com", 587)
    assert (shown["EMAIL_HOST_USER"], shown["EMAIL_HOST_PASSWORD"]) == ("mailer", "s3cret")
    assert (shown["EMAIL_USE_TLS"], shown["EMAIL_USE_SSL"]) == (True, False)


def test_tls_and_ssl_together_are_refused_at_start(tmp_path):
    # Django refuses the pair only when a mail is sent: every delivery would fail, after start said nothing.
    done = _mail_settings(tmp_path, EMAIL_BACKEND=SMTP, EMAIL_USE_TLS="1", EMAIL_USE_SSL="1")

    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "EMAIL_USE_TLS" in last and "EMAIL_USE_SSL" in last


@pytest.mark.parametrize("value", ["api.openai.com/v1", "localhost:11434/v1"])
def test_an_openai_base_url_that_is_no_http_url_is_refused_at_start(tmp_path, value):
    # Taken as it was, every run on `model: openai:…` failed with the SDK's "Connection error.".
    done = _mail_settings(tmp_path, OPENAI_BASE_URL=value)

    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "OPENAI_BASE_URL" in last and "is not an http(s) URL" in last


def test_postgres_connections_hold_no_cursor_past_a_transaction():
    # PgBouncer in transaction mode (README, Production) hands the connection to another client
    # after each transaction: a server-side cursor that outlives one (QuerySet.iterator() in
    # autocommit) would be read from a connection that no longer holds it.
    from dashboard.settings import _database

    assert _database("postgres://agentfast@db.example.com:6432/agentfast")["DISABLE_SERVER_SIDE_CURSORS"] is True
