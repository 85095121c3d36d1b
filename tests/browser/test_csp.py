"""The dashboard works under a strict Content-Security-Policy: no inline script, no eval.

The test sends the policy itself on every page (added to what the server sends, if anything:
several policies are all enforced), records every violation the browser reports, and uses
the live inbox end to end: a card arrives over the websocket and is approved.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from agents.models import Approval
from tests.conftest import wait_for
from tests.support.flows import decide, pending, start
from tests.support.processes import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.browser

REFUND = "Refund order A1001 for 25.00 USD"
RECORD_VIOLATIONS = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.cspViolations.push(event.violatedDirective + " " + (event.blockedURI || "inline") + " " + event.sourceFile);
});
"""


def strict_policy(base_url: str) -> str:
    websocket = "ws://" + urlsplit(base_url).netloc
    return (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        f"connect-src 'self' {websocket}; object-src 'none'; base-uri 'self'; form-action 'self'; "
        "frame-ancestors 'none'"
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium as tests/browser/conftest.py launches it, without its local network checks.

    A page that Playwright fulfils (to add the header) counts as coming from no network, and
    those checks would then refuse its websocket to 127.0.0.1; production pages come from the
    network, so they are not what this test is about.
    """
    if not CHROMIUM.exists():
        pytest.skip(f"Chromium is not installed at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        args = [*CHROMIUM_ARGS, "--disable-features=LocalNetworkAccessChecks"]
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)
        yield chromium
        chromium.close()


def enforce(page: Any, base_url: str) -> list[str]:
    """Send the strict policy with every page this tab loads; return the console's CSP complaints."""
    policy = strict_policy(base_url)

    def add_policy(route: Any) -> None:
        if route.request.resource_type != "document":
            route.continue_()
            return
        response = route.fetch(max_redirects=0)
        headers = dict(response.headers)
        sent = headers.get("content-security-policy")
        headers["content-security-policy"] = f"{sent}, {policy}" if sent else policy
        route.fulfill(response=response, headers=headers)

    page.route("**/*", add_policy)
    page.add_init_script(RECORD_VIOLATIONS)
    complaints: list[str] = []
    page.on("console", lambda message: "Content Security Policy" in message.text and complaints.append(message.text))
    return complaints


def violations(page: Any) -> list[str]:
    return page.evaluate("window.cspViolations")


def assert_policy_in_force(page: Any, complaints: list[str]) -> None:
    """Check that an inline script is refused and reported here, then forget that report."""
    page.evaluate(
        """() => {
          const script = document.createElement("script");
          script.textContent = "window.inlineRan = true";
          document.head.append(script);
        }"""
    )
    # Not wait_for_function: Playwright evaluates its predicate with eval, which the policy refuses.
    wait_for(lambda: violations(page), what="the browser to report the inline script")
    assert page.evaluate("window.inlineRan") is None
    assert violations(page)[0].startswith("script-src-elem inline")
    wait_for(lambda: complaints, what="the console to report the inline script")
    page.evaluate("window.cspViolations = []")
    complaints.clear()


def test_it_runs_the_live_inbox_under_a_strict_policy(viewer, live_server, alice):
    alices = viewer("alice")
    page = alices.page
    complaints = enforce(page, live_server.url)
    page.goto("/")
    assert_policy_in_force(page, complaints)
    page.wait_for_selector(".live[data-state=open]")

    [approval] = pending(start(REFUND, auto_resume=False))  # pushed over the websocket
    page.wait_for_selector(f"#card-{approval.id}")
    expect(page).to_have_title("(1) Inbox · agentfast")  # app.js ran
    page.click(f"#card-{approval.id} [data-action=approve]")
    page.wait_for_selector(f"#card-{approval.id}.decided")
    assert Approval.objects.get(pk=approval.id).status == Approval.Status.APPROVED
    assert violations(page) == []

    [other] = pending(start(REFUND, auto_resume=False))
    page.goto(f"/approvals/{other.id}")
    page.fill("#id_feedback", "Offer 15.00 instead")  # app.js names the buttons
    assert page.inner_text("button[value=rejected]") == "Reject and ask to revise"
    assert page.is_disabled("button[value=approved]")
    assert violations(page) == []

    for path in (f"/approvals/{approval.id}", f"/runs/{approval.run_id}", "/runs", "/playground/"):
        page.goto(path)
        page.wait_for_load_state("networkidle")
        assert violations(page) == [], path
    page.goto(f"/runs/{approval.run_id}")
    page.wait_for_selector(".live[data-state=open]")
    assert violations(page) == []
    assert complaints == [] and alices.errors == []


def test_it_signs_in_and_shows_the_audit_under_a_strict_policy(browser, live_server, carol):
    decide(pending(start(REFUND, auto_resume=False))[0], "approved", by="carol")
    context = browser.new_context(base_url=live_server.url)
    page = context.new_page()
    complaints = enforce(page, live_server.url)
    page.goto("/accounts/login/?next=/audit")
    page.fill("#id_username", "carol")
    page.fill("#id_password", "carol-password")
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + "/audit")
    assert violations(page) == [] and complaints == []
    # Loaded anew, to see the policy hold on this page as well.
    page.goto("/audit")
    assert_policy_in_force(page, complaints)
    page.select_option("select[name=person]", "carol")  # app.js submits the filter
    page.wait_for_url("**/audit?person=carol*")
    assert violations(page) == [] and complaints == []
    context.close()
