"""Desktop notifications, opt-in, for cards that arrive while the tab is hidden; the title counts what waits."""

from __future__ import annotations

import pytest

from agents import services
from tests.browser.conftest import wait_js

REFUND = "Refund order A1001 for 25.00 USD"
CARD = "#inbox-cards > .card"

# Chromium shows a granted notification for real; this records each one the page creates,
# and lets the test say whether the tab is hidden (a headless tab is always visible).
RECORD = """
window.__notified = [];
window.__hidden = false;
Object.defineProperty(document, "visibilityState", { get: function () { return window.__hidden ? "hidden" : "visible"; } });
var RealNotification = window.Notification;
window.Notification = function (title, options) {
  window.__notified.push({ title: title, body: options && options.body });
  return new RealNotification(title, options);
};
window.Notification.requestPermission = RealNotification.requestPermission.bind(RealNotification);
Object.defineProperty(window.Notification, "permission", { get: function () { return RealNotification.permission; } });
"""


@pytest.mark.browser
def test_it_notifies_of_a_card_arriving_in_a_hidden_tab_once_opted_in(start_worker, viewer, alice):
    start_worker()
    alices = viewer("alice")
    alices.context.grant_permissions(["notifications"])
    alices.context.add_init_script(RECORD)
    page = alices.page
    page.reload()
    page.wait_for_selector(".live[data-state=open]")
    toggle = page.locator("#notify-toggle")
    assert toggle.inner_text() == "Desktop notifications: off"

    services.run_create(agent="support", input=REFUND)  # visible tab, not opted in: no notification
    wait_js(page, "() => document.title === '(1) Inbox · agentfast'")
    toggle.click()
    wait_js(page, "() => document.getElementById('notify-toggle').getAttribute('aria-pressed') === 'true'")
    assert toggle.inner_text() == "Desktop notifications: on"

    services.run_create(agent="support", input=REFUND)  # opted in but looking at it: still none
    wait_js(page, "() => document.title === '(2) Inbox · agentfast'")
    assert page.evaluate("() => window.__notified.length") == 0
    page.evaluate("() => { window.__hidden = true; }")
    services.run_create(agent="support", input=REFUND)
    wait_js(page, "() => document.title === '(3) Inbox · agentfast'")
    wait_js(page, "() => window.__notified.length > 0")
    [shown] = page.evaluate("() => window.__notified")
    assert shown["title"] == "agentfast: a call needs your decision"
    assert "refund_request" in shown["body"]
    assert page.locator(CARD).count() == 3

    page.reload()  # the choice is remembered
    assert page.locator("#notify-toggle").inner_text() == "Desktop notifications: on"
    page.locator("#notify-toggle").click()
    assert page.locator("#notify-toggle").inner_text() == "Desktop notifications: off"
    assert alices.errors == []
