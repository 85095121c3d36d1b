"""The live inbox's count: bounded as the page's ("500+"), and each reviewer's own under "For me"."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from agents import services
from dashboard.live import consumers
from dashboard.web import inbox as inbox_pages
from tests.dashboard.conftest import REFUND
from tests.dashboard.test_consumers import EMAIL, connect, in_thread
from tests.dashboard.test_inbox_for_me import inbox
from tests.support.flows import start
from tests.support.policies import support_yaml

pytestmark = pytest.mark.django_db(transaction=True)


def count_of(pushed: str) -> str:
    assert 'id="pending-count"' in pushed
    return pushed.split('id="pending-count" class="count" data-count="', 1)[1].split('"', 1)[0]


@pytest.fixture
def cap_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumers, "INBOX_COUNT_CAP", 1)
    monkeypatch.setattr(inbox_pages, "INBOX_COUNT_CAP", 1)


async def test_it_counts_no_further_than_the_cap(cap_of_one, alice):
    communicator, _, _ = await connect("/ws/inbox/?page=1&show=all", alice)

    await in_thread(start, REFUND)
    assert count_of(await communicator.receive_from(timeout=5)) == "1"
    await in_thread(start, REFUND)
    assert count_of(await communicator.receive_from(timeout=5)) == "1+"
    await communicator.disconnect()


async def test_it_counts_each_reviewers_own_when_too_many_are_restricted(cap_of_one, agent_config, alice, bob):
    agent_config(support_yaml(approvers=["finance"]))
    await in_thread(services.user_set_groups, username="alice", groups=("finance",))
    await in_thread(start, REFUND)  # only finance (alice) may decide these two
    await in_thread(start, REFUND)
    alices, _, _ = await connect("/ws/inbox/?page=1", alice)
    bobs, _, _ = await connect("/ws/inbox/?page=1", bob)

    await in_thread(start, EMAIL)  # anyone's: both inboxes get the card and a count

    assert count_of(await alices.receive_from(timeout=5)) == "1+"  # 3 of them
    assert count_of(await bobs.receive_from(timeout=5)) == "1"  # the email only
    for user, count in ((alice, "1+"), (bob, "1")):
        assert f'data-count="{count}"' in await database_sync_to_async(inbox)(user)  # as the page says
    for communicator in (alices, bobs):
        await communicator.disconnect()
