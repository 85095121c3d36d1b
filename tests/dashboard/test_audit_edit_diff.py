"""Hunt (the record): the audit's diff of an edit names every argument the edit changed.

An external agent's tool has no schema here, so a reviewer's edit is any JSON object: 1 may
become true, 0 false, a null argument may go. Python's == calls 1 and true equal (and a
missing key and a null one the same), so the audit recorded an edit whose diff left them out.
"""

from __future__ import annotations

from typing import Any

from agents.models import AuditEntry
from tests.dashboard.test_gateway import Api, _gate_body, policy, reviewer, robot  # noqa: F401


def _edit(robot: Api, reviewer: Api, call_id: str, before: dict[str, Any], after: dict[str, Any]) -> AuditEntry:  # noqa: F811
    approval_id = robot.post("/api/gate", {**_gate_body(call_id), "arguments": before}).json()["approval_id"]
    decided = reviewer.post(f"/api/approvals/{approval_id}/decide", {"decision": "approved", "arguments": after})
    assert decided.status_code == 200, decided.json()
    return AuditEntry.objects.get(approval_id=approval_id, outcome="decided")


def test_the_diff_names_a_number_made_a_boolean(policy, robot, reviewer):  # noqa: F811
    entry = _edit(robot, reviewer, "c1", {"cents": 2000, "retry": 1}, {"cents": 2000, "retry": True})

    assert entry.detail["arguments_diff"] == {"retry": [1, True]}


def test_the_diff_names_an_argument_removed_that_was_null(policy, robot, reviewer):  # noqa: F811
    entry = _edit(robot, reviewer, "c2", {"cents": 2000, "limit": None}, {"cents": 2000})

    assert "limit" in entry.detail["arguments_diff"]
