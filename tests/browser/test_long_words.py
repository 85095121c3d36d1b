"""Words longer than a line (a pasted token, a note without spaces) wrap inside their card in real Chromium."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from agents.gateway import services as gateway
from agents.models import Approval
from agents.notify.channels import one_click_links
from tests.browser.conftest import Viewer, screenshot
from tests.support.flows import decide, pending, start

pytestmark = pytest.mark.browser

WORD = "x" * 400


def test_it_wraps_a_long_rejection_note_in_the_playground(viewer: Callable[..., Viewer], carol: User) -> None:
    run = start("Email bob@example.com that his refund is on its way")
    [approval] = pending(run)
    decide(approval, "rejected", by="carol", note=WORD, auto_resume=False)
    seen = viewer("carol", path=f"/playground/?run={run.id}")
    page = seen.page

    expect(page.locator(".pg-decided")).to_contain_text(WORD)
    seen.screenshot("playground-long-note")

    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    assert seen.errors == []


def test_it_keeps_every_page_of_a_call_with_one_word_names_and_texts_on_the_screen(
    viewer: Callable[..., Viewer], carol: User
) -> None:
    # An external agent names itself, describes its call and fills the arguments as it likes.
    User.objects.create_user(username="billing-bot")
    request = gateway.GateRequest(
        agent="agent" + "z" * 95,
        session="thread-7",
        call_id="c1",
        tool="send_email",
        arguments={"to": WORD + "@example.com", "subject": WORD, "body": WORD},
        description=WORD,
    )
    asked = gateway.gate_call(owner="billing-bot", request=request)
    decide(asked.approval_id, "rejected", by="carol", note="no")
    again = gateway.gate_call(owner="billing-bot", request=replace(request, call_id="c2"))
    run_id = Approval.objects.get(pk=again.approval_id).run_id
    pages = ["/", f"/approvals/{again.approval_id}", f"/runs/{run_id}", "/runs", "/insights"]

    wide = []
    for width in (390, 1280):
        seen = viewer("carol", viewport={"width": width, "height": 860})
        expect(seen.page.locator(f"#card-{again.approval_id}")).to_be_visible()
        for path in pages:
            seen.page.goto(path)
            scrolled = seen.page.evaluate("document.documentElement.scrollWidth")
            if scrolled > width:
                wide.append((width, path, scrolled))
        seen.page.goto("/")
        seen.screenshot(f"inbox-long-words-{width}")
        assert seen.errors == []
    assert wide == []


def test_it_keeps_a_mailed_one_click_page_on_a_phones_screen(browser: Any, live_server: Any, alice: User) -> None:
    User.objects.create_user(username="billing-bot")
    request = gateway.GateRequest(
        agent="agent" + "z" * 95, session="thread-7", call_id="c1", tool="send_email", arguments={"to": WORD}
    )
    approval = Approval.objects.get(pk=gateway.gate_call(owner="billing-bot", request=request).approval_id)
    link = one_click_links(approval.id, "alice", approval.current_arguments, ("rejected",))["rejected"]
    context = browser.new_context(base_url=live_server.url, viewport={"width": 390, "height": 844})
    page = context.new_page()

    page.goto(urlsplit(link).path)

    expect(page.get_by_role("button", name="Reject as alice")).to_be_visible()
    screenshot(page, "one-click-long-words-390")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    context.close()
