"""/healthz and /metrics as a load balancer and Prometheus ask them: of one process, by its address, over HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from django.test import Client

from agents import services
from dashboard.web import health
from tests.conftest import child_env
from tests.support.processes import Daphne

# The README's production settings: the site's name only, and every plain-HTTP request sent to HTTPS.
PRODUCTION = {
    "DJANGO_ALLOWED_HOSTS": "agentfast.example.com",
    "DJANGO_SECURE_SSL_REDIRECT": "1",
    "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https",
    "DJANGO_SECURE_HSTS_SECONDS": "31536000",
    "AGENTFAST_METRICS_TOKEN": "s3cret-scrape",
}
PROCESS = "10.0.0.7:8321"  # how a balancer or a scrape target names one web process


@pytest.fixture
def production(settings):  # noqa: ANN001, ANN201
    settings.ALLOWED_HOSTS = ["agentfast.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.AGENTFAST_METRICS_TOKEN = "s3cret-scrape"
    return settings


def test_it_answers_a_health_check_of_the_process_address_over_plain_http(db, production):
    response = Client().get("/healthz", headers={"Host": PROCESS})

    assert response.status_code == 200 and response.json() == {"ok": True, "redis": True}


def test_it_says_redis_is_out_of_reach_and_keeps_the_process_in_rotation(db, production, redis_server, caplog):
    # Decisions still land while Redis is down (the sweeper sends their messages once it is back):
    # a balancer should keep the process, and whoever reads the probe should learn why pages stand still.
    redis_server.stop()
    try:
        began = time.monotonic()
        response = Client().get("/healthz", headers={"Host": PROCESS})
        took = time.monotonic() - began
    finally:
        redis_server.start()

    assert response.status_code == 200
    assert response.json() == {"ok": True, "redis": False, "warning": health.REDIS_DOWN}
    assert took < 1  # within the shortest timeout balancers give a probe (Celery's own check took 2 s and more)
    assert "health check: Redis is out of reach" in caplog.text
    assert Client().get("/healthz", headers={"Host": PROCESS}).json() == {"ok": True, "redis": True}


def test_it_serves_metrics_to_a_scraper_of_the_process_address_and_only_with_a_token(carol, production):
    _, admin_token = services.token_create(username="carol")

    for token in ("s3cret-scrape", admin_token):
        response = Client().get("/metrics", headers={"Host": PROCESS, "Authorization": f"Bearer {token}"})
        assert response.status_code == 200 and b"agentfast_pending_approvals " in response.content
        assert "no-store" in response["Cache-Control"]
    assert Client().get("/metrics", headers={"Host": PROCESS}).status_code == 401
    assert Client().get("/metrics", headers={"Host": PROCESS, "Authorization": "Bearer wrong"}).status_code == 401


def test_it_still_refuses_every_other_page_on_an_unknown_host_or_plain_http(carol, production):
    _, admin_token = services.token_create(username="carol")
    bearer = {"Authorization": f"Bearer {admin_token}"}

    assert Client().get("/api/approvals", headers={"Host": PROCESS, **bearer}).status_code == 400
    assert Client().get("/healthz/", headers={"Host": PROCESS}).status_code == 400
    redirected = Client().get("/api/approvals", headers={"Host": "agentfast.example.com", **bearer})
    assert redirected.status_code == 301 and redirected["Location"].startswith("https://agentfast.example.com/")


@pytest.fixture
def production_daphne(django_db_setup: None, tmp_path) -> Iterator[Daphne]:  # noqa: ANN001
    server = Daphne(log=tmp_path / "daphne.log", env=child_env(**PRODUCTION))
    server.start()
    try:
        server.wait_ready()  # its own probe asks http://127.0.0.1:<port>/healthz, as a balancer would
        yield server
    finally:
        server.stop()


@pytest.mark.integration
def test_a_production_web_process_answers_its_probes_by_address(production_daphne):
    health = httpx.get(f"{production_daphne.url}/healthz", timeout=10)
    scrape = httpx.get(
        f"{production_daphne.url}/metrics", headers={"Authorization": "Bearer s3cret-scrape"}, timeout=10
    )

    assert health.status_code == 200 and health.json() == {"ok": True, "redis": True}
    assert scrape.status_code == 200 and "agentfast_runs{" in scrape.text
    assert httpx.get(f"{production_daphne.url}/", timeout=10).status_code == 400


@pytest.mark.integration
@pytest.mark.parametrize("pool", ["0", "20"], ids=["no-pool", "pool"])
def test_it_answers_a_health_check_with_503_soon_while_the_database_is_out_of_reach(
    django_db_setup: None,
    tmp_path,
    pool: str,  # noqa: ANN001
):
    # Nothing listens on port 1. A request with the pool waits 30 s for a connection; a probe must not.
    down = child_env(DATABASE_URL="postgres://agentfast@127.0.0.1:1/agentfast", AGENTFAST_DB_POOL=pool)
    server = Daphne(log=tmp_path / "daphne.log", env=down)
    server.start()
    try:
        health = _first_answer(f"{server.url}/healthz")
    finally:
        server.stop()

    assert (health.status_code, health.json()) == (503, {"ok": False, "error": "the database is out of reach"})
    assert health.elapsed.total_seconds() < 8
    assert "Traceback" not in server.log_tail() and "not open" not in server.log_tail()  # refused, not unready


def _first_answer(url: str, timeout: float = 30) -> httpx.Response:
    """GET the URL as soon as the process listens."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(url, timeout=10)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
