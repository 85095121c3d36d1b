"""An upgrade with work in flight: what waited on people before the migrations is decided and run once after them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from django.contrib.auth.models import User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from agents import services
from agents.models import Approval, Run, SideEffect, ToolCall
from agents.runtime.execution import execute_deferred
from agents.sweeper import sweep
from tests.support.flows import decide, pending, resume, start
from tests.support.policies import support_yaml

# The oldest state an installation of 2026-12-01 may hold: every later column is added to its rows.
BEFORE_LATER_COLUMNS = ("agents", "0014_stranded_runs_index")


def _asked(prompt: str) -> Approval:
    [approval] = pending(start(prompt))
    return approval


def _migrate_back_and_forward() -> None:
    MigrationExecutor(connection).migrate([BEFORE_LATER_COLUMNS])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_it_decides_and_runs_once_what_was_in_flight_across_the_migrations(
    transactional_db, agent_config: Callable[[str], Path], alice: User, bob: User, carol: User, settings
):
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 0
    agent_config(support_yaml(quorum=2))
    one_vote = _asked("Refund order A1001 for 25.00 USD")
    decide(one_vote, "approved", by="alice", auto_resume=False)
    decided = _asked("Refund order A1002 for 30.00 USD")
    for reviewer in ("alice", "carol"):
        decide(decided, "approved", by=reviewer, auto_resume=False)
    mail = _asked("Email dan@example.com that the refund is on its way")
    decide(mail, "approved", by="alice", auto_resume=False)
    claimed = _asked("Refund order A1003 for 40.00 USD")
    for reviewer in ("alice", "carol"):
        decide(claimed, "approved", by=reviewer, auto_resume=False)
    assert services.run_lease(run_id=claimed.run_id, owner="worker-stopped", ttl=0.001)
    assert services.toolcall_claim(tool_call=claimed.tool_call)  # the upgrade stops its worker mid-call
    _, token = services.token_create(username="alice")

    _migrate_back_and_forward()

    assert decide(one_vote, "approved", by="alice", auto_resume=False).outcome == "idempotent"
    assert decide(one_vote, "approved", by="bob", auto_resume=False).outcome == "decided"
    report = sweep()
    # The one decided by bob now leaves the resume to him; the others' messages went with the old workers.
    assert set(report.runs) == {decided.run_id, claimed.run_id}
    assert report.deferred == [mail.tool_call_id]
    for approval in (one_vote, decided, claimed):
        assert resume(approval.run).status == Run.Status.COMPLETED
    assert execute_deferred(mail.tool_call_id) == "succeeded"
    effects = SideEffect.objects.values_list("idempotency_key", flat=True)
    assert sorted(effects) == sorted([one_vote.id, decided.id, mail.id])
    assert ToolCall.objects.get(pk=claimed.tool_call_id).status == ToolCall.Status.IN_DOUBT
    assert services.audit_verify().ok
    assert services.token_authenticate(token) == alice
    client = Client()
    client.force_login(carol)
    for page in ("/", "/runs", "/audit", f"/approvals/{one_vote.id}", f"/runs/{claimed.run_id}"):
        assert client.get(page).status_code == 200, page
