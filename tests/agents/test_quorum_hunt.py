"""Quorum votes: what an adversarial pass found counted wrong.

One person voting under two spellings of their name counted twice; a vote editing the
arguments back to its voter's earlier edit was taken for a repeat.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from django.contrib.auth.models import User

from agents.models import Approval, AuditEntry, RunEvent, arguments_digest
from dashboard import cli
from tests.support.flows import decide, pending, start
from tests.support.policies import support_yaml

REFUND = "Refund order A1001 for 25.00 USD"


def test_a_cli_vote_in_another_case_is_the_same_persons_vote(
    agent_config: Callable[[str], Path], alice: User, bob: User
):
    agent_config(support_yaml(quorum=2))
    [approval] = pending(start(REFUND))

    # alice approves from the CLI typing her name capitalised, then again as herself.
    assert cli.main(["approvals", "approve", approval.id, "--by", "Alice", "--no-resume"]) == 0
    decide(approval, "approved", by="alice", auto_resume=False)

    approval.refresh_from_db()
    # Names are unique ignoring case: that is one person, one approval of the two needed.
    assert approval.status == Approval.Status.PENDING
    assert approval.tally == "1 of 2 approvals: alice"


def test_editing_back_to_ones_own_earlier_edit_is_audited_and_announced_as_an_edit(
    agent_config: Callable[[str], Path], alice: User, bob: User, carol: User
):
    agent_config(support_yaml(quorum=3))
    [approval] = pending(start(REFUND))
    original = approval.tool_call.arguments
    x = {**original, "amount_cents": original["amount_cents"] - 500}
    y = {**original, "amount_cents": original["amount_cents"] - 1000}

    decide(approval, "approved", by="alice", arguments=x, auto_resume=False)  # alice: X
    decide(approval, "approved", by="bob", arguments=y, auto_resume=False)  # bob: Y, alice's X stops counting
    result = decide(approval, "approved", by="alice", arguments=x, auto_resume=False)  # alice: back to X

    approval.refresh_from_db()
    assert approval.arguments_digest == arguments_digest(x)  # the arguments did change, from Y to X
    # ... so this was alice's edit of Y to X: a vote, audited with its diff, and told to viewers
    # (cards and Slack still show Y otherwise), not "idempotent" as if nothing changed.
    assert result.outcome == "voted"
    last = AuditEntry.objects.filter(approval_id=approval.id).order_by("-id").first()
    assert last.outcome == "voted"
    voted = RunEvent.objects.filter(run=approval.run, type=RunEvent.Type.APPROVAL_VOTED).order_by("-seq").first()
    assert voted.data["arguments_digest"] == arguments_digest(x)
    assert approval.status == Approval.Status.PENDING
