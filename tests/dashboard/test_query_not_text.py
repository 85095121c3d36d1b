"""A list's filter whose bytes are not UTF-8 is refused, naming it, not read as U+FFFD and matched by nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.models import Run
from tests.dashboard.test_api import token_for
from tests.dashboard.test_consumers import connect


@pytest.mark.parametrize(
    ("query", "name"),
    [("tool=%FF", "tool"), ("agent=%C3", "agent"), ("status=pending&tool=a%FFb", "tool"), ("%FF=1", "\ufffd")],
)
@pytest.mark.parametrize("path", ["/api/approvals", "/api/runs"])
def test_it_refuses_an_api_list_filter_that_is_not_text(
    client: Client, alice: User, path: str, query: str, name: str
) -> None:
    response = client.get(f"{path}?{query}", headers={"Authorization": f"Bearer {token_for('alice')}"})

    assert response.status_code == 400
    assert response.json() == {
        "error_code": "invalid",
        "message": f"{name}: not valid text (its bytes are not UTF-8)",
        "field": name,
    }


def test_it_refuses_an_event_streams_parameter_that_is_not_text(client: Client, alice: User) -> None:
    headers = {"Authorization": f"Bearer {token_for('alice')}", "Accept": "text/event-stream"}

    response = client.get("/api/events?after=1%FF", headers=headers)

    assert (response.status_code, response.json()["field"]) == (400, "after")
    assert "not valid text" in response.json()["message"]


@pytest.mark.parametrize(
    ("path", "name"),
    [("/?tool=%FF", "tool"), ("/?agent=%FF&q=x", "agent"), ("/runs?q=%C3", "q"), ("/audit?person=%FF", "person")],
)
def test_it_refuses_a_pages_filter_that_is_not_text(
    client_for: Callable[[User], Client], carol: User, paused: Run, path: str, name: str
) -> None:
    response = client_for(carol).get(path)

    assert response.status_code == 400
    assert f"The parameter “{name}” in the address is not valid text" in response.content.decode()


def test_it_refuses_an_audit_exports_filter_that_is_not_text_in_plain_words(
    client_for: Callable[[User], Client], carol: User
) -> None:
    response = client_for(carol).get("/audit.csv?person=%FF")

    assert (response.status_code, response["Content-Type"]) == (400, "text/plain; charset=utf-8")
    assert response.content.decode() == (
        "Nothing exported: The parameter “person” in the address is not valid text (its bytes are not UTF-8).\n"
    )


def test_it_still_searches_for_a_replacement_character_the_client_sent(
    client_for: Callable[[User], Client], carol: User, paused: Run
) -> None:
    """U+FFFD is what repaired text holds: searching for it, escaped as UTF-8, is a search like any other."""
    client = client_for(carol)

    assert client.get("/runs?q=%EF%BF%BD").status_code == 200
    assert client.get("/?q=caf%C3%A9+au+lait").status_code == 200
    headers = {"Authorization": f"Bearer {token_for('carol')}"}
    assert client.get("/api/approvals?tool=%EF%BF%BD", headers=headers).status_code == 200


@pytest.mark.django_db(transaction=True)
async def test_it_refuses_a_live_inbox_whose_filter_is_not_text(alice: User) -> None:
    _, connected, code = await connect("/ws/inbox/?tool=%FF", alice)

    assert (connected, code) == (False, 4400)
