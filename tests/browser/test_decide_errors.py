"""A decision that fails on the way (a 500, a dropped connection, a session that ended) leaves
the card in place with a message, and the reviewer decides again once the server answers
(issue 7, item 19); arguments the server must refuse (erased, nested too deep) are sent to it."""

from __future__ import annotations

import json

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


def _sign_out_elsewhere(viewer) -> object:
    """Sign the viewer out in a second tab of the same browser; return that tab, to sign in again."""
    tab = viewer.context.new_page()
    tab.goto("/runs")
    tab.click(".whoami button")
    tab.wait_for_url("**/accounts/login/**")
    return tab


def _sign_in_again(tab, username: str) -> None:
    tab.goto("/accounts/login/?next=/runs")
    tab.fill("#id_username", username)
    tab.fill("#id_password", f"{username}-password")
    tab.click("button[type=submit]")
    tab.wait_for_url("**/runs")


def test_it_keeps_a_card_and_its_note_when_the_reviewer_was_signed_out(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    alices = viewer("alice")
    page = alices.page
    page.wait_for_selector(".live[data-state=open]")
    card = f"#card-{approval.id}"
    tab = _sign_out_elsewhere(alices)

    page.click(f"{card} [data-action=reject]")
    page.fill(f"{card} textarea[name=note]", "duplicate order")
    page.click(f"{card} button.danger")
    page.wait_for_selector(f"{card} .decide-error:has-text('signed out')")

    assert page.locator("#id_password").count() == 0  # no sign-in page swapped into the card
    assert page.input_value(f"{card} textarea[name=note]") == "duplicate order"
    assert page.get_attribute(f"{card} .decide-error a", "target") == "_blank"
    assert page.locator(f"{card}.deciding").count() == 0
    screenshot(page, "decide-signed-out")
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.PENDING

    _sign_in_again(tab, "alice")  # a new session and CSRF token: the page left open sends the new one
    page.click(f"{card} button.danger")
    page.wait_for_selector(f"{card}.decided")
    approval.refresh_from_db()
    assert (approval.status, approval.note) == (Approval.Status.REJECTED, "duplicate order")
    assert alices.errors == []


def test_it_keeps_the_decision_panel_when_the_reviewer_was_signed_out(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    alices = viewer("alice", path=f"/approvals/{approval.id}")
    page = alices.page
    tab = _sign_out_elsewhere(alices)

    page.fill("#id_note", "checked with finance")
    page.click("button[value=approved]")
    page.wait_for_selector("#decision .decide-error:has-text('signed out')")

    assert page.locator("#id_password").count() == 0 and page.input_value("#id_note") == "checked with finance"
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.PENDING
    _sign_in_again(tab, "alice")
    page.click("button[value=approved]")
    page.wait_for_selector("#decision .decided-line")
    approval.refresh_from_db()
    assert (approval.status, approval.note) == (Approval.Status.APPROVED, "checked with finance")
    assert alices.errors == []


def test_it_refuses_erased_arguments_by_the_field_and_resets_them_to_the_proposal(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    alices = viewer("alice", path=f"/approvals/{approval.id}")
    page = alices.page

    page.fill("#id_arguments", "  \n ")
    page.click("button[value=approved]")
    page.wait_for_selector("#arguments-error")

    assert "The arguments are empty" in page.inner_text("#arguments-error")
    assert page.input_value("#id_arguments") == "  \n "
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.PENDING
    screenshot(page, "arguments-erased")
    page.click("[data-reset-arguments]")
    assert json.loads(page.input_value("#id_arguments")) == approval.tool_call.arguments
    page.click("button[value=approved]")
    page.wait_for_selector("#decision .decided-line")
    approval.refresh_from_db()
    assert (approval.status, approval.arguments) == (Approval.Status.APPROVED, None)
    assert alices.errors == []


def test_it_lets_the_server_refuse_arguments_nested_too_deep_to_compare(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    alices = viewer("alice", path=f"/approvals/{approval.id}")
    page = alices.page

    page.fill("#id_arguments", '{"order_id": "A1001", "x": ' + "[" * 3000 + "]" * 3000 + "}")
    page.click("button[value=approved]")
    page.wait_for_selector("#arguments-error")

    assert "nested deeper than 32 levels" in page.inner_text("#arguments-error")
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.PENDING
    assert alices.errors == []
