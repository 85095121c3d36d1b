"""Whom an email entry reaches: names written as approvers are, and a name that reaches nobody is logged."""

from __future__ import annotations

import logging

from agents import services
from agents.notify.models import Delivery
from tests.support.flows import start

REFUND = "Refund order A1001 for 25.00 USD"
CONFIG = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, approvers: [finance, user:dan]}
notifications:
  - kind: email
    to: [finance, user:dan, group:finance, nobody-here]
"""


def test_it_mails_a_person_named_as_approvers_are_and_logs_the_names_that_reach_nobody(
    db, agent_config, caplog, django_capture_on_commit_callbacks
):
    services.user_create(username="fiona", role="reviewer", email="fiona@example.com", groups=("finance",))
    services.user_create(username="dan", role="reviewer", email="dan@example.com")
    agent_config(CONFIG)

    with caplog.at_level(logging.WARNING, logger="agents.notify"), django_capture_on_commit_callbacks(execute=True):
        start(REFUND)

    assert {d.target for d in Delivery.objects.filter(kind="email")} == {"fiona", "dan"}
    assert [record.getMessage() for record in caplog.records if record.name == "agents.notify.dispatch"] == [
        (
            "email notifications: 'finance' is no active reviewer with an email address "
            "(a group is written group:finance); nobody is mailed for it"
        ),
        "email notifications: 'nobody-here' is no active reviewer with an email address; nobody is mailed for it",
    ]
