"""A standing grant is its creator's say: a new account that takes a departed creator's name must not inherit it."""

from __future__ import annotations

import pytest

from agents import services
from agents.models import Approval, AuditEntry, Grant, Run
from tests.support import flows

HOUR = services.Remember(scope="exact", seconds=3600)
PROMPT = "Refund order A1001 for 25.00 USD"


def _granted_by_alice() -> Grant:
    run = flows.start(PROMPT)
    [approval] = flows.pending(run)
    return flows.decide(approval, "approved", by="alice", remember=HOUR).grant


@pytest.mark.parametrize("leaves", ["deleted", "renamed"])
def test_a_new_user_named_like_a_departed_grant_creator_does_not_revive_the_grant(alice, leaves):
    grant = _granted_by_alice()
    if leaves == "deleted":
        alice.delete()  # Django admin (a superuser) or the shell
    else:
        alice.username = "alicia"  # Django admin's user change form
        alice.save()

    services.user_create(username="alice", role="reviewer", password="another-alice-pw")  # someone else
    run = flows.start(PROMPT)

    approval = Approval.objects.get(run=run, tool="refund_request")
    assert approval.decided_by != f"grant:{grant.id}"
    assert run.status != Run.Status.COMPLETED


def test_the_grants_a_name_takes_away_are_revoked_by_the_system_and_audited(alice):
    grant = _granted_by_alice()

    alice.username = "alicia"
    alice.save()

    grant.refresh_from_db()
    assert (grant.revoked_by, grant.revoked_at is not None) == ("system", True)
    [entry] = AuditEntry.objects.filter(action="revoked", actor="system")
    assert entry.detail["reason"] == "alice was renamed alicia"


def test_a_login_saves_no_extra_read_for_the_rename_check(alice, django_assert_num_queries):
    alice.last_name = "Liddell"
    with django_assert_num_queries(1):  # the UPDATE of the named field alone
        alice.save(update_fields=["last_name"])
