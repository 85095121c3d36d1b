"""Polish: the admin linked and branded, the favicon, quiet process logs, the demo model's pace."""

from __future__ import annotations

import re

from django.test import Client

from agents.llm import demo
from dashboard import processes


def test_it_links_the_branded_admin_for_admins_only(client_for, alice, carol):
    assert '<a href="/admin/">Admin</a>' in client_for(carol).get("/runs").content.decode()
    assert '<a href="/admin/">Admin</a>' not in client_for(alice).get("/runs").content.decode()

    admin_page = client_for(carol).get("/admin/").content.decode()
    assert "<title>The engine&#x27;s rows, read-only | agentfast admin</title>" in admin_page
    assert re.search(r'<a href="/admin/">agentfast admin</a>', admin_page)


def test_it_serves_a_favicon_in_svg_and_ico(client_for, alice):
    page = client_for(alice).get("/runs").content.decode()
    assert 'rel="icon" href="/static/favicon.svg" type="image/svg+xml"' in page

    redirect = Client().get("/favicon.ico")
    assert redirect.status_code == 301 and redirect["Location"] == "/static/favicon.ico"


def test_it_keeps_celery_and_daphne_at_warning_unless_asked(monkeypatch, tmp_path):
    monkeypatch.delenv("AGENTFAST_LOG_LEVEL", raising=False)
    assert processes.log_level() == "WARNING"
    assert "--loglevel=WARNING" in processes._dev_processes(tmp_path, 8321)["beat"]

    monkeypatch.setenv("AGENTFAST_LOG_LEVEL", "info")
    assert "--loglevel=INFO" in processes._dev_processes(tmp_path, 8321)["beat"]


def test_it_paces_the_demo_models_words_only_when_asked(settings):
    settings.AGENTFAST_DEMO_DELAY_MS = 15
    assert demo._token_pause() == 0.015

    settings.AGENTFAST_DEMO_DELAY_MS = 0
    assert demo._token_pause() == 0
