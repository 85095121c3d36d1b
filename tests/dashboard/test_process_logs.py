"""What the web and worker processes write to their logs: each line of agentfast's once."""

from __future__ import annotations

import httpx
import pytest

from agents import services
from agents.models import Run
from tests.conftest import child_env, wait_for
from tests.support.processes import Daphne


@pytest.mark.integration
def test_a_worker_writes_each_line_of_agentfast_once(start_worker):
    worker = start_worker()

    run = services.run_create(agent="support", input="hello", created_by="bob")
    wait_for(lambda: Run.objects.get(pk=run.pk).status == "completed", what="the worker to drive the run")

    wait_for(lambda: f"drove {run.id}" in worker.log_tail(), what="the worker to log the drive")
    assert worker.log_path.read_text().count(f"drove {run.id}: completed") == 1


@pytest.mark.integration
def test_a_web_process_writes_each_line_of_agentfast_once(transactional_db, alice, redis_server, tmp_path):
    _, token = services.token_create(username="alice")
    server = Daphne(log=tmp_path / "daphne.log", env=child_env())
    server.start()
    try:
        server.wait_ready()
        redis_server.stop()  # the run is stored; its message cannot be sent, and that is logged

        created = httpx.post(
            f"{server.url}/api/runs",
            json={"agent": "support", "input": "hello"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )

        assert created.status_code == 201, created.text
        line = f"could not enqueue agents.tasks.run_start({created.json()['id']!r},)"
        wait_for(lambda: line in server.log_tail(), what="the web process to log the lost message")
        assert server.log_path.read_text().count(line) == 1
    finally:
        server.stop()
