"""The playground in real Chromium: prompt, pause, inline approval, and the resumed run
streaming to its final answer in the same view. No worker runs: the page drives its runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Locator, expect

from agents.models import Approval, AuditEntry, Run, RunEvent, SideEffect
from tests.browser.conftest import Viewer
from tests.dashboard.conftest import XSS
from tests.support.flows import decide

pytestmark = pytest.mark.browser

REFUND = "Refund order A1001 for 25.00 USD"


def raw_log(viewer: Viewer) -> list[tuple[str, str]]:
    """Return the raw event log as (id, event) pairs."""
    rows = viewer.page.locator("#pg-raw-log li")
    return [(row.locator(".pg-raw-id").inner_text(), row.locator(".pg-raw-event").inner_text()) for row in rows.all()]


def test_it_streams_a_run_through_an_inline_approval_to_the_final_answer(
    viewer: Callable[..., Viewer], alice: User
) -> None:
    seen = viewer("alice", path="/playground/")
    page = seen.page
    page.select_option("#pg-agent", "support")
    page.get_by_role("button", name=REFUND).click()  # a demo prompt fills the box
    page.click("#pg-run")

    card = page.locator(".pg-approval")
    expect(card).to_be_visible()
    expect(page.locator("#pg-status")).to_have_text("suspended")
    expect(card.locator(".pg-tool")).to_have_text("refund_request")
    expect(page.locator(".pg-assistant").first).to_have_text("agentLet me look up order A1001 first.")
    expect(page.locator(".pg-call .pg-call-status")).to_have_text("ok")  # lookup_order ran

    seen.screenshot("playground-paused")
    card.locator(".pg-note").fill("within policy")
    card.locator(".pg-approve").click()

    final = page.locator(".pg-assistant.final .pg-text")
    expect(final).to_contain_text("Refunded 25.00 USD for order A1001")
    expect(page.locator("#pg-status")).to_have_text("completed")
    expect(card.locator(".pg-decided")).to_have_text("Approved by alice: within policy")
    expect(page.locator(".pg-user").first).to_contain_text(REFUND)  # the same view, from the prompt on

    run = Run.objects.get()
    log = raw_log(seen)
    stored = [int(ident[1:]) for ident, _ in log if ident.startswith("#")]
    assert stored == list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    events = [event for _, event in log]
    resumed = events[events.index("approval_decided") :]
    assert "delta" in resumed and resumed[-2:] == ["run_status", "end"]  # the resumed run streamed its tokens

    assert (run.created_by, run.started_from) == ("alice", "playground")
    approval = Approval.objects.get(run=run)
    assert (approval.status, approval.decided_by) == ("approved", "alice")
    assert SideEffect.objects.filter(idempotency_key=approval.id).count() == 1
    assert AuditEntry.objects.get(approval_id=approval.id).source == "api"
    expect(page.locator("#pg-history li.current .badge")).to_have_text("completed")
    seen.screenshot("playground")
    assert seen.errors == [] and seen.dialogs == []


def test_it_shows_model_and_tool_text_as_text(viewer: Callable[..., Viewer], alice: User) -> None:
    seen = viewer("alice", path="/playground/")
    page = seen.page
    page.fill("#pg-input", XSS)
    page.click("#pg-run")
    card = page.locator(".pg-approval")
    expect(card.locator(".pg-mode")).to_have_text("defer")
    expect(card.locator(".pg-args")).to_contain_text("<img src=x onerror=alert(1)>")
    expect(page.locator("#pg-status")).to_have_text("completed")  # a deferred call does not pause the run
    page.reload()  # the history entry and the replay of the run render the same text
    expect(page.locator(".pg-approval .pg-args")).to_contain_text("<img src=x onerror=alert(1)>")
    assert page.locator("img").count() == 0
    assert seen.errors == [] and seen.dialogs == []


def test_it_runs_an_agent_composed_on_the_page_within_agentfast_yamls_floor(
    viewer: Callable[..., Viewer], alice: User
) -> None:
    seen = viewer("alice", path="/playground/")
    page = seen.page
    page.select_option("#pg-agent", label="Compose an agent…")
    compose = page.locator("#pg-compose")
    expect(compose).to_be_visible()
    compose.locator("#pg-system").fill("You are a careful support agent.")
    for tool in ("lookup_order", "refund_request"):
        compose.locator(f"input[name=tools][value={tool}]").check()
    # agentfast.yaml gates refunds: the page offers nothing lower, and says why.
    expect(page.locator("select[name=risk_refund_request] option[value=low]")).to_be_disabled()
    expect(page.locator("select[name=mode_refund_request] option[value=defer]")).to_be_disabled()
    expect(page.locator("li:has(select[name=risk_refund_request]) .pg-floor")).to_contain_text("never remove them")
    expect(page.locator("li:has(select[name=risk_lookup_order]) .pg-floor")).to_have_count(0)
    page.fill("#pg-input", REFUND)
    seen.screenshot("playground-compose")
    page.click("#pg-run")
    card = page.locator(".pg-approval")
    expect(card.locator(".pg-tool")).to_have_text("refund_request")
    expect(page.locator("#pg-status")).to_have_text("suspended")
    run = Run.objects.get()
    assert run.agent.startswith("playground-")
    assert [a.tool_call.name for a in Approval.objects.filter(run=run)] == ["refund_request"]
    assert not SideEffect.objects.exists()

    page.goto(f"/runs/{run.id}")
    definition = page.locator("#run-agent")
    expect(definition).to_contain_text("You are a careful support agent.")
    expect(definition).to_contain_text("refund_request high risk, suspend")
    expect(definition).to_contain_text("lookup_order low risk")
    assert seen.errors == [] and seen.dialogs == []


def test_it_keeps_feedback_typed_before_approving_and_says_it_goes_with_a_rejection(
    viewer: Callable[..., Viewer], alice: User
) -> None:
    seen, card = _paused_on_a_card(viewer)

    card.locator(".pg-revise summary").click()
    card.locator(".pg-feedback").fill("refund 20.00 instead")
    card.locator(".pg-approve").click()

    expect(card.locator(".pg-card-error")).to_contain_text("feedback")
    expect(card.locator(".pg-feedback")).to_have_value("refund 20.00 instead")
    assert Approval.objects.get().status == Approval.Status.PENDING
    assert seen.errors == []


def test_it_says_a_decision_that_did_not_reach_the_server_and_lets_it_be_sent_again(
    viewer: Callable[..., Viewer], alice: User
) -> None:
    seen, card = _paused_on_a_card(viewer)
    card.locator(".pg-note").fill("checked with the customer")

    seen.page.route("**/decide", lambda route: route.abort())
    card.locator(".pg-approve").click()

    expect(card.locator(".pg-card-error")).to_contain_text("not recorded")
    expect(card.locator(".pg-approve")).to_be_enabled()
    expect(card.locator(".pg-note")).to_have_value("checked with the customer")
    seen.page.unroute("**/decide")
    card.locator(".pg-approve").click()
    expect(card.locator(".pg-approval-status")).to_have_text("approved")


def test_it_shows_back_what_was_typed_when_someone_else_decided_first(
    viewer: Callable[..., Viewer], alice: User, bob: User
) -> None:
    seen, card = _paused_on_a_card(viewer)
    expect(seen.page.locator("#pg-status")).to_have_text("suspended")
    # bob decides from the inbox just as alice's rejection is on its way.
    seen.page.route("**/decide", lambda route: (_bob_approves(), route.continue_()))

    card.locator(".pg-note").fill("the customer cancelled the order")
    card.locator(".pg-reject").click()

    expect(card.locator(".pg-decided")).to_contain_text("Approved by bob")
    expect(card.locator(".pg-unrecorded")).to_contain_text("Your note (not recorded): the customer cancelled the order")
    assert Approval.objects.get().decided_by == "bob"
    assert seen.errors == []


def test_it_shows_back_what_was_typed_on_a_card_decided_elsewhere(
    viewer: Callable[..., Viewer], alice: User, bob: User
) -> None:
    seen, card = _paused_on_a_card(viewer)
    card.locator(".pg-note").fill("half a thought about the refund")
    card.locator(".pg-edit summary").click()
    card.locator(".pg-edit-args").fill('{"order_id": "A1001", "amount_cents": 100}')

    _bob_approves()

    expect(card.locator(".pg-decided")).to_contain_text("Approved by bob")
    expect(card.locator(".pg-decide")).to_be_hidden()
    unrecorded = card.locator(".pg-unrecorded")
    expect(unrecorded).to_contain_text("Your note (not recorded): half a thought about the refund")
    expect(unrecorded).to_contain_text('Your arguments (not recorded): {"order_id": "A1001", "amount_cents": 100}')
    expect(unrecorded).not_to_contain_text("Your feedback")
    assert seen.errors == []


def _bob_approves() -> None:
    decide(Approval.objects.get(), "approved", by="bob", auto_resume=False)


def _paused_on_a_card(viewer: Callable[..., Viewer]) -> tuple[Viewer, Locator]:
    """Run the refund prompt in alice's playground; return her viewer and the card of the call it paused on."""
    seen = viewer("alice", path="/playground/")
    seen.page.select_option("#pg-agent", "support")
    seen.page.fill("#pg-input", REFUND)
    seen.page.click("#pg-run")
    card = seen.page.locator(".pg-approval")
    expect(card).to_be_visible()
    return seen, card


def test_it_sends_an_edited_integer_past_2_53_as_typed(viewer: Callable[..., Viewer], alice: User) -> None:
    seen, card = _paused_on_a_card(viewer)
    sent: list[str] = []
    seen.page.on("request", lambda request: sent.extend([request.post_data or ""] * request.url.endswith("/decide")))

    card.locator(".pg-edit summary").click()
    # A browser's JSON.parse reads 9007199254740995 as 9007199254740996.
    card.locator(".pg-edit-args").fill('{"order_id": "A1001", "amount_cents": 9007199254740995}')
    card.locator(".pg-approve").click()

    expect(card.locator(".pg-card-error")).to_contain_text("amount_cents")  # the tool's check refuses it, naming it
    assert '"amount_cents":9007199254740995' in sent[0]
    assert seen.errors == []
