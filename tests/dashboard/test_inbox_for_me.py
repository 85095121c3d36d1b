"""The inbox's "For me" (what I may decide, the default) and "All" (read-only for the rest), page and live."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from agents import services
from tests.dashboard.conftest import REFUND
from tests.dashboard.test_consumers import EMAIL, connect, in_thread
from tests.support.flows import decide, pending, start
from tests.support.policies import support_yaml


@pytest.fixture
def finance_refund(agent_config, alice: User, bob: User) -> tuple[str, str]:
    """A refund only finance may approve (alice is in finance) and an email anyone may; their approval ids."""
    agent_config(support_yaml(approvers=["finance"], quorum=2))
    services.user_set_groups(username="alice", groups=("finance",))
    [refund] = pending(start(REFUND))
    [email] = pending(start(EMAIL))
    return refund.id, email.id


def inbox(user: User, query: str = "") -> str:
    client = Client()
    client.force_login(user)
    response = client.get("/" + query)
    assert response.status_code == 200
    return response.content.decode()


def test_it_lists_only_what_i_may_decide_by_default(finance_refund, bob: User):
    refund, email = finance_refund

    page = inbox(bob)

    assert f'id="card-{email}"' in page
    assert f'id="card-{refund}"' not in page


def test_it_lists_everything_with_all_read_only_where_i_may_not_decide(finance_refund, bob: User):
    refund, email = finance_refund

    page = inbox(bob, "?show=all")

    assert f'id="card-{refund}" class="card readonly"' in page
    assert "Waits for finance (0 of 2)" in page
    refund_card = page.split(f'id="card-{refund}"', 1)[1].split("</article>", 1)[0]
    assert "Approve</button>" not in refund_card and "Reject</button>" not in refund_card
    assert f'id="card-{email}" class="card"' in page


def test_it_lists_an_approvers_calls_for_them_with_the_tally(finance_refund, alice: User, bob: User):
    refund, _ = finance_refund
    services.user_set_groups(username="bob", groups=("finance",))
    decide(refund, "approved", by="bob", auto_resume=False)

    page = inbox(alice)

    assert f'id="card-{refund}" class="card"' in page
    assert "1 of 2 approvals: bob" in page


def test_it_keeps_users_role_when_setting_groups(alice: User):
    services.user_set_groups(username="alice", groups=("finance", "managers"))
    services.user_set_groups(username="alice", groups=("managers",))

    assert set(alice.groups.values_list("name", flat=True)) == {"reviewer", "managers"}


@pytest.mark.django_db(transaction=True)
async def test_it_pushes_a_card_only_to_those_it_is_for_and_updates_the_tally_live(agent_config, alice, bob, carol):
    agent_config(support_yaml(approvers=["finance"], quorum=2))
    await in_thread(services.user_set_groups, username="alice", groups=("finance",))
    await in_thread(services.user_set_groups, username="carol", groups=("finance",))
    alices, _, _ = await connect("/ws/inbox/?page=1", alice)
    bobs, _, _ = await connect("/ws/inbox/?page=1", bob)
    bobs_all, _, _ = await connect("/ws/inbox/?page=1&show=all", bob)

    run = await in_thread(start, REFUND)
    [approval] = await database_sync_to_async(pending)(run)

    assert f'id="card-{approval.id}" class="card"' in await alices.receive_from(timeout=5)
    assert f'id="card-{approval.id}" class="card readonly"' in await bobs_all.receive_from(timeout=5)
    assert await bobs.receive_nothing(timeout=0.3)

    await in_thread(decide, approval, "approved", by="carol", auto_resume=False)
    updated = await alices.receive_from(timeout=5)
    assert f'id="card-{approval.id}"' in updated and 'hx-swap-oob="true"' in updated
    assert "1 of 2 approvals: carol" in updated
    for communicator in (alices, bobs, bobs_all):
        await communicator.disconnect()
