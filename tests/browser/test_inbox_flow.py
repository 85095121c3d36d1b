"""Two reviewers in real Chromium: a run started from the CLI pauses, its card appears in
both inboxes without a reload, alice approves with an edited amount, the card leaves bob's
inbox, the run finishes in the worker with the edited amount. Screenshots go to
artifacts/screenshots/."""

from __future__ import annotations

import subprocess
import sys

import pytest
from playwright.sync_api import Page

from agents.models import Approval, Run, SideEffect
from tests.browser.conftest import screenshot, wait_js
from tests.conftest import ROOT, child_env, wait_for
from tests.support.flows import pending, start

pytestmark = pytest.mark.browser

REFUND = "Refund order A1001 for 25.00 USD"
XSS_PAYLOAD = "<img src=x onerror=alert(1)>"
XSS = f"Email bob@example.com that {XSS_PAYLOAD}"
CARD = "#inbox-cards > .card"


def cli_start(prompt: str) -> str:
    """Start a run the way a developer would, from the CLI; return its id."""
    done = subprocess.run(
        [sys.executable, "-m", "agents.cli", "runs", "start", "--agent", "support", prompt],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.split()[0]


def wait_live(page: Page) -> None:
    """Wait until the page's websocket is open (the live dot turns green)."""
    page.wait_for_selector(".live[data-state=open]")


def test_it_shows_a_paused_call_to_every_reviewer_and_runs_the_edited_approval(start_worker, viewer, alice, bob, carol):
    start_worker()
    alices, bobs = viewer("alice"), viewer("bob")
    for person in (alices, bobs):
        wait_live(person.page)
        assert person.page.locator(".empty").is_visible()

    run_id = cli_start(REFUND)

    for person in (alices, bobs):
        card = person.page.wait_for_selector(CARD)
        assert "Refund 25.00 on A1001" in card.inner_text() and "refund_request" in card.inner_text()
        wait_js(person.page, "document.title === '(1) Inbox · agentfast'")
    approval = Approval.objects.get(run_id=run_id)
    alices.screenshot("inbox")
    phone = viewer("bob", viewport={"width": 390, "height": 844})
    phone.page.wait_for_selector(CARD)
    phone.screenshot("inbox-phone")

    # Bob watches the run's timeline in a second tab, and has the approval open in a third.
    timeline = bobs.context.new_page()
    timeline.goto(f"/runs/{run_id}")
    wait_live(timeline)
    late = bobs.context.new_page()
    late.goto(f"/approvals/{approval.id}")

    alices.page.click(f"#card-{approval.id} [data-action=open]")
    alices.page.wait_for_selector("#id_arguments")
    alices.screenshot("approval")
    alices.page.fill("#id_arguments", '{"order_id": "A1001", "amount_cents": 1500}')
    alices.page.fill("#id_note", "Half now, the rest after the return arrives.")
    alices.page.click("button[value=approved]")
    assert "amount_cents: 2500 → 1500" in alices.page.inner_text(".diff-preview")  # shown before it is sent
    alices.page.click("[data-preview-send]")
    alices.page.wait_for_selector("#decision .decided-line")
    assert "Approved by alice" in alices.page.inner_text("#decision")
    assert alices.page.inner_text("#approval-status") == "approved"

    # Bob, a moment late, has the approval open: it says live who decided, and his buttons are off
    # (a decision sent anyway is refused with 409: tests/dashboard/test_approval.py).
    wait_js(late, "document.getElementById('approval-status').textContent.trim() === 'approved'")
    assert late.inner_text("#approval-live .live-status").startswith("alice approved this")
    assert late.is_disabled("#decision button[value=rejected]")
    screenshot(late, "approval-decided-first")

    bobs.page.wait_for_selector(f"#card-{approval.id}", state="detached")
    wait_js(bobs.page, "document.title === 'Inbox · agentfast'")
    assert bobs.page.locator(".empty").is_visible()
    # The timeline grows live: the decision, then the refund, then the answer.
    timeline.wait_for_selector("#timeline .event.type-run_status")
    assert "Refunded 15.00 USD for order A1001" in timeline.inner_text("#timeline")
    assert timeline.inner_text("#run-status") == "completed"
    screenshot(timeline, "timeline")

    wait_for(lambda: Run.objects.get(pk=run_id).status == Run.Status.COMPLETED, what="the run to complete")
    [effect] = SideEffect.objects.all()
    assert effect.arguments == {"order_id": "A1001", "amount_cents": 1500}
    assert effect.idempotency_key == approval.id

    audit = viewer("carol", path="/audit")
    assert "Half now, the rest after the return arrives." in audit.page.inner_text("table.audit")
    assert audit.page.inner_text("table.diff ins") == "1500"
    audit.screenshot("audit")
    for person in (alices, bobs, phone, audit):
        assert person.dialogs == [] and person.errors == []


def test_it_shows_a_hostile_email_as_text_everywhere_and_runs_no_script(start_worker, viewer, carol):
    start_worker()
    admin = viewer("carol")
    page = admin.page
    wait_live(page)

    run_id = cli_start(XSS)

    card = page.wait_for_selector(CARD)
    assert XSS_PAYLOAD in card.inner_text()
    approval = Approval.objects.get(run_id=run_id)
    page.goto(f"/approvals/{approval.id}")
    assert XSS_PAYLOAD in page.inner_text(".args")
    assert XSS in page.inner_text(".conversation")
    page.fill("#id_note", f"checked {XSS_PAYLOAD}")
    page.fill("#id_arguments", page.input_value("#id_arguments").replace(XSS_PAYLOAD, XSS_PAYLOAD + " (ok)"))
    page.click("button[value=approved]")
    page.click("[data-preview-send]")
    page.wait_for_selector("#decision .decided-line")
    wait_for(lambda: SideEffect.objects.exists(), what="the deferred email to be sent")
    page.goto(f"/runs/{run_id}")
    page.wait_for_selector("#timeline .event.type-tool_result >> text=deferred call")
    assert XSS_PAYLOAD in page.inner_text("#timeline")
    page.goto("/audit")
    assert f"checked {XSS_PAYLOAD}" in page.inner_text("table.audit")
    assert XSS_PAYLOAD + " (ok)" in page.inner_text("table.diff ins")
    admin.screenshot("audit-xss")

    assert page.locator("main img").count() == 0
    assert admin.dialogs == [] and admin.errors == []


def test_it_reconnects_after_the_server_drops_and_shows_what_it_missed(start_worker, viewer, live_server, alice):
    start_worker()
    alices = viewer("alice")
    page = alices.page
    wait_live(page)
    # Retry fast: the default backoff (full jitter, up to 64 s) is for real outages.
    page.evaluate("htmx.config.wsReconnectDelay = () => 200")

    live_server.kill()  # a crash or a deploy: every websocket drops (1006)
    page.wait_for_selector(".live[data-state=closed]")
    run_id = cli_start(REFUND)  # its card is pushed while nobody listens
    wait_for(lambda: Approval.objects.filter(run_id=run_id).exists(), what="the run to pause")
    live_server.start()
    live_server.wait_ready()

    page.wait_for_selector(CARD)
    wait_live(page)
    assert page.locator(CARD).count() == 1
    assert alices.errors == []


def test_it_moves_approves_and_rejects_with_the_keyboard(viewer, alice):
    alices = viewer("alice")
    page = alices.page
    wait_live(page)
    # Paused in this process, with no resume to enqueue: no worker needed.
    first, second = (pending(start(REFUND, auto_resume=False))[0] for _ in range(2))  # the oldest on top
    page.wait_for_selector(f"#card-{first.id}")
    page.wait_for_selector(f"#card-{second.id}")

    page.keyboard.press("j")
    assert "selected" in page.get_attribute(f"#card-{first.id}", "class")
    page.keyboard.press("j")
    page.keyboard.press("k")
    page.keyboard.press("j")
    page.keyboard.press("k")
    assert "selected" in page.get_attribute(f"#card-{first.id}", "class")
    page.keyboard.press("a")  # a high-risk call: the first key only asks for a second
    assert "press a again" in page.inner_text(f"#card-status-{first.id}")
    assert Approval.objects.get(pk=first.id).status == "pending"
    page.keyboard.press("a")
    page.wait_for_selector(f"#card-{first.id}.decided")
    # The selection moved to the card left; r opens its rejection note, typing goes there.
    assert "selected" in page.get_attribute(f"#card-{second.id}", "class")
    page.keyboard.press("r")
    page.keyboard.type("not this one")
    page.click(f"#card-{second.id} button.danger")
    page.wait_for_selector(f"#card-{second.id}.decided")

    wait_for(lambda: Approval.objects.get(pk=first.id).status == "approved", what="the approval")
    rejected = Approval.objects.get(pk=second.id)
    assert (rejected.status, rejected.note, rejected.decided_by) == ("rejected", "not this one", "alice")
    page.wait_for_selector(".empty", state="visible")
    assert alices.errors == []
