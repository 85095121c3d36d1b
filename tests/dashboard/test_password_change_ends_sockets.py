"""A password changed on the site's own page ends the user's other open sockets, as `users password` does.

README: "A stream or websocket whose access ends (logout, revoked token, deactivated, role
removed, password set) ends". Changing one's password is how a reviewer shuts out a session
someone else holds: Django ends that session for pages at once, and its open inbox must not
keep receiving every new call for minutes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import connections
from django.test import Client

from tests.dashboard.test_consumers import open_socket

pytestmark = pytest.mark.django_db(transaction=True)

NEW_PASSWORD = "a new long passphrase 42"


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    yield
    await sync_to_async(connections.close_all)()


def _change_password_on_the_site(user) -> int:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    response = client.post(
        "/accounts/password_change/",
        {"old_password": "alice-password", "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    return response.status_code


async def test_a_password_changed_on_the_site_closes_the_users_other_open_inbox(alice):
    other, other_client = await open_socket(alice)  # a session held elsewhere

    status = await database_sync_to_async(_change_password_on_the_site)(alice)

    assert status == 302  # changed
    # Pages of the other session are over at once (Django's session hash)...
    assert (await database_sync_to_async(other_client.get)("/")).status_code == 302
    # ...and so is its live inbox.
    output = await other.receive_output(timeout=5)
    assert output["type"] == "websocket.close" and output["code"] == 4403, output
    await other.disconnect()
