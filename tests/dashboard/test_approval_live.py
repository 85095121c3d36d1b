"""The approval page's socket: who else has it open, and votes and decisions as they happen."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from tests.dashboard.conftest import REFUND
from tests.dashboard.test_consumers import connect, in_thread
from tests.support.flows import decide, pending, start
from tests.support.policies import support_yaml

pytestmark = pytest.mark.django_db(transaction=True)


async def receive_until(communicator, text: str) -> str:
    """Return the first push that contains `text` (presence pushes may come first)."""
    while True:
        pushed = await communicator.receive_from(timeout=5)
        if text in pushed:
            return pushed


async def test_it_shows_who_else_is_viewing_and_drops_them_when_they_leave(alice, bob):
    [approval] = await database_sync_to_async(pending)(await in_thread(start, REFUND))
    alices, connected, _ = await connect(f"/ws/approvals/?id={approval.id}", alice)
    assert connected
    first = await alices.receive_from(timeout=5)
    assert "Also viewing" not in first  # alone: nobody else

    bobs, _, _ = await connect(f"/ws/approvals/?id={approval.id}", bob)
    joined = await receive_until(alices, "Also viewing")
    assert '<span class="viewer">bob</span>' in joined and '<span class="viewer">alice</span>' not in joined

    await bobs.disconnect()
    left = await alices.receive_from(timeout=5)
    assert 'id="approval-live"' in left and "bob" not in left
    await alices.disconnect()


async def test_it_pushes_votes_and_the_decision_to_an_open_approval(alice, bob, carol, agent_config):
    agent_config(support_yaml(quorum=2))
    [approval] = await database_sync_to_async(pending)(await in_thread(start, REFUND))
    alices, _, _ = await connect(f"/ws/approvals/?id={approval.id}", alice)
    await alices.receive_from(timeout=5)

    await in_thread(decide, approval, "approved", by="bob")
    voted = await receive_until(alices, "1 of 2 approvals: bob")
    assert 'id="approval-status" class="badge status-pending" hx-swap-oob="true"' in voted

    await in_thread(decide, approval, "rejected", by="carol", note="no")
    decided = await receive_until(alices, "carol rejected this")
    assert 'id="approval-status" class="badge status-rejected" hx-swap-oob="true"' in decided
    await alices.disconnect()


async def test_it_refuses_an_approval_socket_for_no_approval_or_no_reviewer(alice, dave):
    for path in ("/ws/approvals/", "/ws/approvals/?id=appr_nothing", "/ws/approvals/?id=%00"):
        _, connected, code = await connect(path, alice)
        assert (connected, code) == (False, 4404)
    _, connected, code = await connect("/ws/approvals/?id=appr_x", dave)
    assert (connected, code) == (False, 4403)
