"""A decision that fails on the way (a 500, a dropped connection) leaves the card in place
with a message, and the reviewer decides again once the server answers (issue 7, item 19)."""

from __future__ import annotations

import pytest

from agents.models import Approval
from tests.browser.conftest import screenshot
from tests.support.flows import pending, start

pytestmark = pytest.mark.browser

REFUND = "Refund order A1001 for 25.00 USD"


def test_it_keeps_the_card_with_an_error_and_decides_on_retry(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    alices = viewer("alice")
    page = alices.page
    page.wait_for_selector(".live[data-state=open]")
    card, decide_url = f"#card-{approval.id}", f"**/approvals/{approval.id}/decide"

    page.route(decide_url, lambda route: route.fulfill(status=500, body="boom"))
    page.click(f"{card} [data-action=approve]")
    page.wait_for_selector(f"{card} .decide-error")
    assert "not recorded" in page.inner_text(f"{card} .decide-error")
    assert "500" in page.inner_text(f"{card} .decide-error")
    assert page.locator(f"{card}.deciding").count() == 0 and page.is_visible(f"{card} [data-action=approve]")
    screenshot(page, "decide-error")
    page.unroute(decide_url)

    page.route(decide_url, lambda route: route.abort())
    page.click(f"{card} [data-action=reject]")
    page.fill(f"{card} textarea[name=note]", "not now")
    page.click(f"{card} button.danger")
    page.wait_for_selector(f"{card} .decide-error:has-text('reach')")
    assert page.input_value(f"{card} textarea[name=note]") == "not now"  # what was typed stays
    page.unroute(decide_url)

    page.click(f"{card} button.danger")
    page.wait_for_selector(f"{card}.decided")
    assert page.locator(f"{card} .decide-error").count() == 0
    approval.refresh_from_db()
    assert (approval.status, approval.note) == (Approval.Status.REJECTED, "not now")
    assert alices.errors == []


def test_it_shows_a_failed_decision_on_the_approval_page(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    alices = viewer("alice", path=f"/approvals/{approval.id}")
    page = alices.page
    decide_url = f"**/approvals/{approval.id}/decide"

    page.route(decide_url, lambda route: route.fulfill(status=500, body="boom"))
    page.fill("#id_note", "fine by me")
    page.click("button[value=approved]")
    page.wait_for_selector("#decision .decide-error")
    assert page.input_value("#id_note") == "fine by me"
    page.unroute(decide_url)

    page.click("button[value=approved]")
    page.wait_for_selector("#decision .decided-line")
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.APPROVED
    assert alices.errors == []
