"""The inbox's "For me" as one SQL filter agrees with the rule each decision checks, case by case."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.auth.models import Group, User

from agents import selectors, services
from agents.models import Approval, Run
from agents.services import eligibility
from tests.support.flows import pending, start
from tests.support.policies import support_yaml

REFUND = "Refund order A1001 for 25.00 USD"

APPROVERS = [
    [],
    ["finance"],
    ["managers"],
    ["user:alice"],
    ["user:bob"],
    ["finance", "user:bob"],
    ["managers", "user:alice"],
    ["alice"],  # a group named like alice, not alice herself
    ["user:"],
]


@pytest.fixture
def approval(agent_config, alice: User, bob: User) -> Approval:  # noqa: ANN001
    agent_config(support_yaml())
    services.user_set_groups(username="alice", groups=("finance",))
    [first] = pending(start(REFUND))
    return first


@pytest.mark.parametrize("username", ["alice", "bob", "carol"])
def test_for_me_in_sql_matches_the_rule_for_every_restriction(approval: Approval, username: str, carol: User):
    user = User.objects.get(username=username)
    # A group whose name reads like a person must not make carol "user:bob".
    Group.objects.get_or_create(name="user:bob")[0].user_set.add(carol)
    for approvers, four_eyes, creator in itertools.product(APPROVERS, (False, True), ("alice", "bob", "")):
        Approval.objects.filter(pk=approval.pk).update(approvers=approvers, four_eyes=four_eyes)
        Run.objects.filter(pk=approval.run_id).update(created_by=creator)
        fresh = Approval.objects.select_related("run").get(pk=approval.pk)
        user = User.objects.get(username=username)  # no cached groups or permissions between cases

        in_sql = eligibility.decidable(user, selectors.approval_list()).filter(pk=approval.pk).exists()

        assert in_sql == eligibility.may_decide(user, fresh), (username, approvers, four_eyes, creator)


def test_for_me_lists_nothing_for_someone_who_may_not_decide(approval: Approval):
    viewer, _ = services.user_create(username="vera", role="agent")

    assert not eligibility.decidable(viewer, selectors.approval_list()).exists()
