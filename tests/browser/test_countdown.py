"""A card's deadline counts down live in real Chromium (static/js/countdown.js, no inline script)."""

from __future__ import annotations

import pytest

from agents.models import Approval
from tests.browser.conftest import wait_js
from tests.browser.test_inbox_flow import wait_live
from tests.support.flows import pending, start
from tests.support.policies import support_yaml

pytestmark = pytest.mark.browser

REFUND = "Refund order A1001 for 25.00 USD"


def test_it_counts_a_cards_deadline_down_and_extends_it(agent_config, viewer, alice):
    agent_config(support_yaml(timeout="10m"))
    alices = viewer("alice")
    wait_live(alices.page)

    [approval] = pending(start(REFUND))
    countdown = f"#card-{approval.id} time[data-deadline]"
    alices.page.wait_for_selector(countdown)
    first = alices.page.inner_text(countdown)
    wait_js(alices.page, "([s, first]) => document.querySelector(s).textContent !== first", arg=[countdown, first])
    assert alices.page.inner_text(countdown).startswith("9 min")  # counted by the script, not the server's wording

    alices.page.click(f"#card-{approval.id} [data-action=extend]")
    wait_js(alices.page, "s => document.querySelector(s)?.textContent.startsWith('1 h 09 min')", arg=countdown)
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    alices.screenshot("deadline-countdown")
    assert alices.errors == []
