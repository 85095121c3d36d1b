"""Ids in a URL that no row can have (NUL: PostgreSQL text holds none) find nothing, never a database error."""

from __future__ import annotations

import pytest

from tests.dashboard.test_consumers import connect


def test_it_opens_the_playground_without_a_run_named_with_nul(client_for, alice):
    response = client_for(alice).get("/playground/", {"run": "run_\x00"})

    assert response.status_code == 200
    assert 'data-run-id=""' in response.content.decode()


@pytest.mark.django_db(transaction=True)
async def test_it_refuses_a_timeline_socket_of_a_run_named_with_nul(alice):
    for path in ("/ws/runs/run_%00/", "/ws/runs/run_\x00/"):
        _, connected, code = await connect(path, alice)

        assert (connected, code) == (False, 4404)
