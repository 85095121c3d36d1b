"""The admin answers a made-up filter or id with its own "not found" or "invalid filter", never a 500."""

from __future__ import annotations

import pytest

from tests.dashboard.conftest import REFUND
from tests.support.flows import start


@pytest.mark.parametrize(
    "query",
    [
        {"agent": "support\x00"},  # PostgreSQL text holds no NUL: comparing with one is an error there
        {"status": "\x00"},
        {"id__exact": "run_\x00"},
        {"created_at__year": "99999"},  # no such year: the lookup fails while the SQL is written
    ],
    ids=["nul-filter", "nul-choice", "nul-lookup", "year-out-of-range"],
)
def test_it_refuses_a_filter_no_row_can_match_as_invalid(client_for, carol, query):
    start(REFUND)

    response = client_for(carol).get("/admin/agents/run/", query)

    assert response.status_code == 302 and response["Location"] == "/admin/agents/run/?e=1"


@pytest.mark.parametrize("page", ["change", "history"])
def test_it_says_a_row_with_an_id_holding_nul_does_not_exist(client_for, carol, page):
    start(REFUND)

    response = client_for(carol).get(f"/admin/agents/run/run_%00/{page}/")

    assert response.status_code == 302 and response["Location"] == "/admin/"
