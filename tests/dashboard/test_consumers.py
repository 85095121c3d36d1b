"""The live pushes, through the real ASGI stack (origin check, session auth, routing) and
the real Redis channel layer: cards in, cards out, timelines growing, strangers refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from agents import events, services
from dashboard.asgi import application
from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, resume, start

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")

EMAIL = "Email bob@example.com that his refund is on its way"


def _session_cookie(user: User) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def connect(
    path: str, user: User | None = None, *, origin: bytes | None = b"http://localhost", host: bytes = b"localhost"
) -> tuple[WebsocketCommunicator, bool, int | None]:
    headers = [(b"host", host)] + ([(b"origin", origin)] if origin is not None else [])
    if user is not None:
        headers.append((b"cookie", await database_sync_to_async(_session_cookie)(user)))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect(timeout=5)
    return communicator, connected, code


async def in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run engine code the way a worker would (its events reach Redis before it returns)."""
    return await database_sync_to_async(func)(*args, **kwargs)


async def test_it_refuses_anonymous_connections():
    for path in ("/ws/inbox/", "/ws/runs/run_x/"):
        _, connected, code = await connect(path)
        assert (connected, code) == (False, 4403)


async def test_it_refuses_users_without_a_role(dave):
    for path in ("/ws/inbox/", "/ws/runs/run_x/"):
        _, connected, code = await connect(path, dave)
        assert (connected, code) == (False, 4403)


async def test_it_refuses_a_foreign_origin(alice):
    _, connected, _ = await connect("/ws/inbox/", alice, origin=b"http://evil.example")

    assert connected is False


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        (b"http://localhost:9999", b"localhost"),  # another local port
        (b"http://localhost", b"localhost:8321"),  # the site is on a port, the page on none
        (b"https://localhost", b"localhost"),  # another scheme
        (b"http://localhost.evil.example", b"localhost"),
        (b"null", b"localhost"),
        (None, b"localhost"),  # no Origin at all
    ],
)
async def test_it_refuses_an_origin_other_than_the_sites_own(alice, origin, host):
    _, connected, _ = await connect("/ws/inbox/", alice, origin=origin, host=host)

    assert connected is False


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        (b"http://localhost", b"localhost"),
        (b"http://localhost:8321", b"localhost:8321"),
        (b"http://LOCALHOST:80", b"localhost"),
    ],
)
async def test_it_accepts_exactly_the_sites_own_origin(alice, origin, host):
    communicator, connected, _ = await connect("/ws/inbox/", alice, origin=origin, host=host)

    assert connected is True
    await communicator.disconnect()


async def test_it_accepts_a_trusted_origin(alice, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://review.example.com"]
    communicator, connected, _ = await connect("/ws/inbox/", alice, origin=b"https://review.example.com")

    assert connected is True
    await communicator.disconnect()


async def test_it_closes_a_socket_to_an_unknown_path_with_4404(alice):
    for path in ("/ws/nowhere/", "/", "/ws/runs/"):
        _, connected, code = await connect(path, alice)
        assert (connected, code) == (False, 4404)


async def test_it_answers_a_handshake_whose_query_is_not_utf_8(alice):
    """A client may send raw bytes in the handshake's query; the socket answers, it does not crash.

    The inbox refuses a filter that is not text (4400, as its page answers 400) rather than show no card.
    """
    cookie = await database_sync_to_async(_session_cookie)(alice)
    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)]
    answers = {}
    for path in ("/ws/inbox/", "/ws/approvals/"):
        communicator = WebsocketCommunicator(application, path, headers=headers)
        communicator.scope["query_string"] = b"q=\xff\xfe&id=appr_\xff"
        answers[path] = await communicator.connect(timeout=5)
        await communicator.disconnect()

    assert answers == {"/ws/inbox/": (False, 4400), "/ws/approvals/": (False, 4404)}


async def test_it_pushes_a_card_when_an_agent_pauses_and_removes_it_when_decided(alice):
    communicator, connected, _ = await connect("/ws/inbox/?page=1", alice)
    assert connected

    run = await in_thread(start, REFUND)
    [approval] = await database_sync_to_async(pending)(run)
    pushed = await communicator.receive_from(timeout=5)

    assert pushed.startswith('<div hx-swap-oob="beforeend:#inbox-cards">')  # the oldest first: new ones last
    assert f'<article id="card-{approval.id}" class="card"' in pushed
    assert "&quot;amount_cents&quot;: 2500" in pushed
    assert 'id="pending-count" class="count" data-count="1" hx-swap-oob="true"' in pushed

    await in_thread(decide, approval, "approved", by="bob", auto_resume=False)
    removed = await communicator.receive_from(timeout=5)

    assert f'<div id="card-{approval.id}" hx-swap-oob="delete"></div>' in removed
    assert "bob approved this" in removed  # the status line of a card someone may be working on
    assert 'data-count="0"' in removed
    await communicator.disconnect()


async def test_it_pushes_only_cards_that_match_the_inbox_filters(alice):
    communicator, _, _ = await connect("/ws/inbox/?tool=send_email&page=1", alice)

    await in_thread(start, REFUND)
    assert await communicator.receive_nothing(timeout=0.3)
    run = await in_thread(start, EMAIL)
    [approval] = await database_sync_to_async(pending)(run)
    pushed = await communicator.receive_from(timeout=5)

    assert f'id="card-{approval.id}"' in pushed and "send_email" in pushed
    assert 'data-count="1"' in pushed  # the filtered count, not every pending approval
    await communicator.disconnect()


async def test_every_open_inbox_gets_each_card_once_and_closing_some_stops_none_of_the_others(alice, bob):
    # One subscription per process feeds every inbox: members come and go around it.
    leaving, _, _ = await connect("/ws/inbox/", alice)
    staying, _, _ = await connect("/ws/inbox/", alice)
    other, _, _ = await connect("/ws/inbox/", bob)
    filtered, _, _ = await connect("/ws/inbox/?tool=send_email", bob)
    await leaving.disconnect()

    run = await in_thread(start, REFUND)
    [approval] = await database_sync_to_async(pending)(run)

    for communicator in (staying, other):
        assert f'id="card-{approval.id}"' in await communicator.receive_from(timeout=5)
        assert await communicator.receive_nothing(timeout=0.3)  # once, not once per socket
    assert await filtered.receive_nothing(timeout=0.3)
    for communicator in (staying, other, filtered):
        await communicator.disconnect()

    # Every inbox closed, then a new one opened: it is fed again.
    again, _, _ = await connect("/ws/inbox/", bob)
    run = await in_thread(start, REFUND)
    [approval] = await database_sync_to_async(pending)(run)
    pushed = await again.receive_from(timeout=5)
    assert f'id="card-{approval.id}"' in pushed
    assert 'data-count="2"' in pushed  # both runs wait
    await again.disconnect()


async def test_it_inserts_no_card_into_a_later_page_but_still_removes_decided_ones(alice):
    communicator, _, _ = await connect("/ws/inbox/?page=2", alice)

    run = await in_thread(start, REFUND)
    assert await communicator.receive_nothing(timeout=0.3)
    [approval] = await database_sync_to_async(pending)(run)
    await in_thread(decide, approval, "rejected", by="bob", auto_resume=False)

    assert 'hx-swap-oob="delete"' in await communicator.receive_from(timeout=5)
    await communicator.disconnect()


async def test_it_appends_a_runs_events_to_its_timeline_live(alice):
    run = await in_thread(start, REFUND)
    [approval] = await database_sync_to_async(pending)(run)
    communicator, connected, _ = await connect(f"/ws/runs/{run.id}/", alice)
    assert connected

    await in_thread(decide, approval, "approved", by="bob", auto_resume=False)
    decided = await communicator.receive_from(timeout=5)

    assert decided.startswith('<div hx-swap-oob="beforeend:#timeline">')
    assert 'class="event type-approval_decided"' in decided and "by bob" in decided
    assert 'id="run-status" class="badge status-suspended" hx-swap-oob="true"' in decided

    await in_thread(resume, run)
    pushed = [await communicator.receive_from(timeout=5)]
    while 'class="event type-run_status"' not in pushed[-1]:
        pushed.append(await communicator.receive_from(timeout=5))

    kinds = [html.split('class="event type-')[1].split('"')[0] for html in pushed]
    assert kinds[-3:] == ["tool_result", "message", "run_status"]
    assert "Refunded 25.00 USD for order A1001" in pushed[-2]
    assert 'id="run-status" class="badge status-completed" hx-swap-oob="true"' in pushed[-1]
    await communicator.disconnect()


async def test_it_refuses_a_timeline_of_an_unknown_run(alice):
    _, connected, code = await connect("/ws/runs/run_nope/", alice)

    assert (connected, code) == (False, 4404)


async def test_it_removes_the_card_of_an_expired_approval(alice, paused):
    [approval] = await database_sync_to_async(pending)(paused)
    communicator, _, _ = await connect("/ws/inbox/", alice)

    await in_thread(
        services.approval_expire, approval=approval, actor="system", reason="no decision in time", resume=False
    )

    assert f'<div id="card-{approval.id}" hx-swap-oob="delete"></div>' in await communicator.receive_from(timeout=5)
    await communicator.disconnect()


async def test_it_pushes_a_timeline_event_whose_stored_text_has_a_lone_surrogate(alice):
    run = await in_thread(services.run_create, agent="support", input="hi", enqueue=False)
    communicator, connected, _ = await connect(f"/ws/runs/{run.id}/", alice)
    assert connected

    await in_thread(events.publish, run_id=run.id, type="message", data={"role": "assistant", "content": "a\ud800b"})
    pushed = await communicator.receive_from(timeout=5)

    assert "a\ufffdb" in pushed
    pushed.encode()  # what daphne does with it
    await communicator.disconnect()


# -- access that ends, ends live ----------------------------------------------------------


async def open_socket(user: User, path: str = "/ws/inbox/") -> tuple[WebsocketCommunicator, Client]:
    """Open a socket (the inbox's by default) with a fresh session of the user; return it and that session's client."""

    def sign_in() -> Client:
        client = Client()
        client.force_login(user)
        return client

    client = await database_sync_to_async(sign_in)()
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", cookie)]
    communicator = WebsocketCommunicator(application, path, headers=headers)
    assert (await communicator.connect(timeout=5))[0]
    return communicator, client


async def _closed(communicator: WebsocketCommunicator) -> int:
    output = await communicator.receive_output(timeout=5)
    assert output["type"] == "websocket.close", output
    return output["code"]


def _deactivate(user: User) -> None:
    user.is_active = False
    user.save()  # what the admin's user form does


def _delete(user: User) -> None:
    user.delete()  # what the admin's delete page does


def _remove_role(user: User) -> None:
    user.groups.remove(Group.objects.get(name="reviewer"))  # what the admin's user form does


async def test_it_closes_the_sockets_of_a_session_that_logs_out_and_keeps_the_others(alice):
    leaving, client = await open_socket(alice)
    staying, _ = await open_socket(alice)

    await database_sync_to_async(client.logout)()

    assert await _closed(leaving) == 4403
    assert await staying.receive_nothing(timeout=0.3)
    await staying.disconnect()


def _take_the_roles_permission(user: User) -> None:
    Group.objects.get(name="reviewer").permissions.remove(_decide())  # the admin's group form, for everyone in it


def _clear_the_roles_permissions(user: User) -> None:
    Group.objects.get(name="reviewer").permissions.clear()


def _empty_the_role(user: User) -> None:
    Group.objects.get(name="reviewer").user_set.clear()  # the group's side of the same table


def _delete_the_role(user: User) -> None:
    Group.objects.get(name="reviewer").delete()


def _decide() -> Permission:
    return Permission.objects.get(codename="decide_approval")


@pytest.mark.parametrize(
    "end_access",
    [
        _deactivate,
        _delete,
        _remove_role,
        _empty_the_role,
        _delete_the_role,
        _take_the_roles_permission,
        _clear_the_roles_permissions,
    ],
)
async def test_it_closes_a_socket_when_its_user_loses_access(alice, end_access):
    communicator, _ = await open_socket(alice)

    await database_sync_to_async(end_access)(alice)

    assert await _closed(communicator) == 4403


def _own_permission_removed(user: User) -> None:
    user.user_permissions.remove(_decide())


def _own_permissions_cleared(user: User) -> None:
    user.user_permissions.clear()


def _superuser_demoted(user: User) -> None:
    user.is_superuser = False
    user.save()  # what the admin's user form does


def _permission_taken_from_its_side(user: User) -> None:
    _decide().user_set.remove(user)  # the same table, edited from the permission's end


@pytest.mark.parametrize(
    "end_access",
    [_own_permission_removed, _own_permissions_cleared, _superuser_demoted, _permission_taken_from_its_side],
)
async def test_it_closes_a_socket_when_a_permission_given_to_the_user_alone_is_taken(db, end_access):
    def reviewer_by_permission() -> User:
        # A reviewer by a permission of their own, or as a superuser, in no group.
        superuser = end_access is _superuser_demoted
        user = User.objects.create_user(username="dan", password="dan-password", is_superuser=superuser)
        if not superuser:
            user.user_permissions.add(_decide())
        return user

    dan = await database_sync_to_async(reviewer_by_permission)()
    communicator, _ = await open_socket(dan)

    await database_sync_to_async(end_access)(await database_sync_to_async(User.objects.get)(pk=dan.pk))

    assert await _closed(communicator) == 4403


async def test_it_keeps_a_socket_open_when_another_user_loses_access(alice, bob):
    communicator, _ = await open_socket(alice)

    await database_sync_to_async(_deactivate)(bob)

    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()
