"""A tool that never returns, in a worker's thread: its run is handed on, not held for ever.

Celery's time limits need the prefork pool; a worker's threads have none, and the lease keeper
renewed the lease of a run whose tool hung for as long as the process lived: the run stayed
`running`, could not be cancelled (its call was running), and nobody else could drive it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from agents import services
from agents.models import Run, SideEffect, ToolCall
from agents.runtime import drive, driver
from agents.tools import ToolContext, tool
from tests.support.fake_openai import FakeOpenAI, Reply, tool_messages

_CARRIER_ANSWERS = threading.Event()


@tool
def ask_carrier(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Ask the carrier where an order is; the carrier never answers until the test lets it."""
    services.sideeffect_record(tool="ask_carrier", idempotency_key=ctx.idempotency_key, arguments={"o": order_id})
    _CARRIER_ANSWERS.wait(timeout=60)
    return {"where": "depot"}


@pytest.fixture
def support(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAI, settings: Any) -> FakeOpenAI:
    settings.OPENAI_MAX_RETRIES = 0
    config = {
        "agents": {
            "support": {"model": "openai:test-model", "base_url": fake_openai.base_url, "tools": ["ask_carrier"]}
        }
    }
    path = tmp_path / "agentfast.yaml"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("AGENTFAST_CONFIG", str(path))
    fake_openai.script(
        lambda body: (
            Reply(content="Done.")
            if tool_messages(body)
            else Reply(tool_calls=[("call_ask", "ask_carrier", '{"order_id": "A1001"}')])
        )
    )
    return fake_openai


def _wait_for(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_it_lets_the_lease_of_a_run_whose_tool_hangs_run_out_and_the_run_go_on(
    transactional_db: None, support: FakeOpenAI, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.AGENTFAST_LEASE_SECONDS = 0.9
    monkeypatch.setattr(driver, "TOOL_LEASE_SECONDS", 1.5)
    _CARRIER_ANSWERS.clear()
    run_id = services.run_create(agent="support", input="Where is order A1001?", enqueue=False).id

    def first_worker() -> None:
        try:
            drive(run_id)
        finally:
            connections.close_all()

    stuck = threading.Thread(target=first_worker)
    stuck.start()
    try:
        assert _wait_for(lambda: SideEffect.objects.filter(tool="ask_carrier").exists(), 10)

        def lease_ran_out() -> bool:
            run = Run.objects.get(pk=run_id)
            return run.lease_expires_at is not None and run.lease_expires_at < timezone.now()

        assert _wait_for(lease_ran_out, 8), "the hung tool's lease is still renewed"

        # Another worker (the sweeper's re-drive) takes the run on: the call is in doubt, never run again.
        assert drive(run_id).status == "completed"
        call = ToolCall.objects.get(run_id=run_id, call_id="call_ask")
        assert call.status == ToolCall.Status.IN_DOUBT
        assert tool_messages(support.requests[-1])[-1]["content"]["error_code"] == "IN_DOUBT"
    finally:
        _CARRIER_ANSWERS.set()
        stuck.join(timeout=30)
    # The hung thread came back late: its writes are refused, nothing ran twice, the run stays done.
    assert SideEffect.objects.filter(tool="ask_carrier").count() == 1
    assert Run.objects.get(pk=run_id).status == "completed"
    assert ToolCall.objects.get(run_id=run_id, call_id="call_ask").status == ToolCall.Status.IN_DOUBT
