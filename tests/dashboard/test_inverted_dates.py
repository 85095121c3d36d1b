"""A date range whose end comes before its start (From and To swapped) is named, not shown as "nothing"."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from tests.dashboard.test_audit import history  # noqa: F401 (a fixture)

TODAY = timezone.now().date()
SWAPPED = {"since": str(TODAY), "until": str(TODAY - timedelta(days=1))}


def test_it_says_the_audit_range_ends_before_it_starts(client_for, carol, history):  # noqa: F811
    response = client_for(carol).get("/audit", SWAPPED)

    assert "until: To is before From: swap them." in response.content.decode()


def test_it_exports_nothing_for_an_audit_range_that_ends_before_it_starts(client_for, carol, history):  # noqa: F811
    response = client_for(carol).get("/audit.csv", SWAPPED)

    assert response.status_code == 400
    assert response.content.decode() == "Nothing exported: until: To is before From: swap them.\n"


def test_it_says_the_runs_range_ends_before_it_starts(client_for, alice, history):  # noqa: F811
    response = client_for(alice).get("/runs", SWAPPED)

    assert "until: To is before From: swap them." in response.content.decode()
