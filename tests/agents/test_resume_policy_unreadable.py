"""A resume driven while agentfast.yaml is half saved waits for the file, as decisions and deadlines do."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agents.models import Run, SideEffect
from tests.support.flows import decide, pending, resume, start

SUPPORT = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high}
"""


def test_an_approved_run_resumed_while_the_policy_file_is_half_saved_is_not_lost(
    db: None, agent_config: Any, settings: Any, alice: Any
) -> None:
    """Decisions and deadlines wait out an unreadable agentfast.yaml; a resume driven in that moment fails the run for good.

    The approved refund then never runs: the failed run is left alone by the sweeper, though the
    file reads again a moment later.
    """
    from agents import sweeper
    from agents.policy.config import get_policy

    path = agent_config(SUPPORT)
    run = start("Refund order A1001 for 25.00 USD")
    [approval] = pending(run)
    decide(approval, "approved")

    path.write_text(SUPPORT + "\n  broken: [\n")  # an editor's half-written save
    run = resume(run)  # the decision's resume message, taken by a worker now
    path.write_text(SUPPORT)
    get_policy()

    settings.AGENTFAST_SWEEP_GRACE_SECONDS = 0
    assert run.status != Run.Status.FAILED, run.error
    # Its lease runs out (the worker let go of it): the sweeper drives it again.
    Run.objects.filter(pk=run.pk).update(
        updated_at=run.updated_at - timedelta(minutes=5), lease_expires_at=run.updated_at - timedelta(minutes=5)
    )
    assert run.id in sweeper.sweep().runs
    run = resume(run)
    assert run.status == Run.Status.COMPLETED
    assert SideEffect.objects.filter(idempotency_key=approval.id).count() == 1
