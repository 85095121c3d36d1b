"""Sign-in with input no account has: refused as a wrong password is, and counted towards the lockout."""

from __future__ import annotations

from django.test import Client

from tests.dashboard.test_access import fail_to_sign_in


def test_it_refuses_and_locks_out_a_user_name_longer_than_any_account_has(db, settings):
    # Longer than the throttle's own record of a name (255 characters): counted, never a 500.
    name = "ä" * 300

    assert fail_to_sign_in(Client(), name, settings.AXES_FAILURE_LIMIT) == [200] * (settings.AXES_FAILURE_LIMIT - 1) + [
        429
    ]
