"""Access that changes while a connection is open, and the names and tokens that grant it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db import connections
from django.test import Client
from django.utils import timezone

from agents import cli, events, services
from agents.services import tokens
from agents.services.errors import InvalidInput
from dashboard.live import consumers
from tests.dashboard.test_consumers import open_socket

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "a new long passphrase 42"


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    """Close the connections of sync_to_async's threads, which a socket's re-checks opened: later tests count them."""
    yield
    await sync_to_async(connections.close_all)()


async def _closed(communicator: WebsocketCommunicator) -> int:
    """Return the close code the socket's app sent, once the app has finished."""
    output = await communicator.receive_output(timeout=5)
    assert output["type"] == "websocket.close", output
    await communicator.disconnect()
    return output["code"]


async def test_it_closes_the_open_inbox_of_a_user_whose_password_is_set(alice):
    communicator, client = await open_socket(alice)

    await database_sync_to_async(services.user_set_password)(username="alice", password=PASSWORD)

    assert await _closed(communicator) == 4403
    # As Django does: the session signed in with the old password is over for pages too.
    response = await database_sync_to_async(client.get)("/")
    assert response.status_code == 302


async def test_it_closes_the_open_timeline_of_a_user_whose_password_is_set(alice):
    run = await database_sync_to_async(services.run_create)(agent="support", input="hi", enqueue=False)
    communicator, _ = await open_socket(alice, f"/ws/runs/{run.id}/")

    await database_sync_to_async(services.user_set_password)(username="alice", password=PASSWORD)

    assert await _closed(communicator) == 4403


async def test_it_keeps_other_users_sockets_open_when_a_password_is_set(alice, bob):
    communicator, _ = await open_socket(alice)

    await database_sync_to_async(services.user_set_password)(username="bob", password=PASSWORD)

    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


# -- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("lookalike", ["ａlice", "ＡＬＩＣＥ"])
def test_it_refuses_a_name_that_normalizes_to_an_existing_one(alice, lookalike):
    with pytest.raises(InvalidInput, match="already exists"):
        services.user_create(username=lookalike, role="reviewer")

    assert list(User.objects.values_list("username", flat=True)) == ["alice"]


def test_it_stores_a_name_as_the_sign_in_form_reads_it(db):
    user, password = services.user_create(username="ｅrin", role="reviewer")

    assert user.username == "erin"
    client = Client()
    response = client.post("/accounts/login/", {"username": "ｅrin", "password": password})
    assert response.status_code == 302 and response.url == "/"


def test_it_sets_the_password_of_the_user_named_exactly_when_names_differ_in_case(alice):
    # The Django admin and createsuperuser do not compare names ignoring case.
    twin = User.objects.create_user(username="Alice", password="the twins old passphrase")

    cli.main(["users", "password", "Alice", "--password", PASSWORD])

    twin.refresh_from_db()
    alice.refresh_from_db()
    assert twin.check_password(PASSWORD) and not alice.check_password(PASSWORD)


def test_it_refuses_a_name_that_matches_several_users_but_none_exactly(alice):
    User.objects.create_user(username="Alice")

    with pytest.raises(InvalidInput, match="several users"):
        services.user_set_password(username="ALICE", password=PASSWORD)
    with pytest.raises(InvalidInput, match="several users"):
        services.user_set_groups(username="ALICE", groups=("finance",))


# -- tokens --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a\udcffb", "a\x00b"])
def test_it_refuses_a_token_name_that_is_not_clean_text_and_creates_nothing(alice, capsys, name):
    code = cli.main(["tokens", "create", "alice", "--name", name])

    assert code == 1 and "name" in capsys.readouterr().err
    assert not alice.api_tokens.exists()


def test_it_creates_a_token_for_a_name_typed_as_the_sign_in_form_reads_it(alice, capsys):
    assert cli.main(["tokens", "create", "ａlice"]) == 0

    assert alice.api_tokens.count() == 1


def test_a_revoked_token_stays_refused_and_revoking_it_again_is_harmless(alice, capsys):
    _, secret = services.token_create(username="alice")
    assert cli.main(["tokens", "revoke", secret]) == 0
    assert cli.main(["tokens", "revoke", secret]) == 0

    response = Client().get("/api/approvals", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 401


@pytest.mark.parametrize("prefix", ["", "af_", "af__x", "_"])
def test_it_revokes_nothing_for_an_empty_prefix(alice, capsys, prefix):
    services.token_create(username="alice")

    assert cli.main(["tokens", "revoke", prefix]) == 1
    assert not alice.api_tokens.filter(revoked_at__isnull=False).exists()


def test_an_agent_tokens_decision_is_refused(db, approval):
    services.user_create(username="robot", role="agent")
    _, secret = services.token_create(username="robot")

    response = Client().post(
        f"/api/approvals/{approval.pk}/decide",
        {"decision": "approved", "decided_by": "robot"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )

    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending"


# -- access that ends without anyone saying so --------------------------------------------


def _end_session(client: Client) -> None:
    """Expire the session in the table, as its age does (no signal says so)."""
    Session.objects.filter(session_key=client.session.session_key).update(expire_date=timezone.now())


async def test_it_closes_an_open_inbox_whose_session_expired(alice, monkeypatch):
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.2)
    communicator, client = await open_socket(alice)

    await database_sync_to_async(_end_session)(client)

    assert await _closed(communicator) == 4403


async def test_it_keeps_an_inbox_open_while_its_session_lasts(alice, monkeypatch):
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.1)
    communicator, _ = await open_socket(alice)

    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()


async def test_it_sends_no_event_to_a_timeline_whose_session_expired(alice, monkeypatch):
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.0)
    run = await database_sync_to_async(services.run_create)(agent="support", input="hi", enqueue=False)
    communicator, client = await open_socket(alice, f"/ws/runs/{run.id}/")

    await database_sync_to_async(_end_session)(client)
    await database_sync_to_async(events.publish)(run_id=run.id, type="run_status", data={"status": "running"})

    assert await _closed(communicator) == 4403


def test_it_draws_a_tokens_prefix_again_when_it_is_taken(alice, monkeypatch):
    first, _ = services.token_create(username="alice")
    draws = iter([first.prefix, first.prefix, "0badcafe"])
    monkeypatch.setattr(tokens.secrets, "token_hex", lambda _: next(draws))

    second, secret = services.token_create(username="alice", name="second")

    assert second.prefix == "0badcafe" and secret.startswith("af_0badcafe_")
    assert services.token_authenticate(secret) == alice
