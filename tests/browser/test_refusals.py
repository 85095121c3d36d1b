"""Refused approvals in real Chromium: a deny rule added to agentfast.yaml while calls wait, met on
every place a reviewer approves from (card, keyboard, bulk, approval page, Run now, playground).

This module's daphne reads a policy file the tests rewrite, so the server judges each approval
against the policy as it stands, as an operator's edit would leave it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from agents import services
from agents.models import Approval
from tests.browser.conftest import Viewer, wait_js, wait_live
from tests.conftest import child_env
from tests.support.flows import pending, start
from tests.support.policies import support_yaml
from tests.support.processes import Daphne

pytestmark = pytest.mark.browser

REFUND = "Refund order A1001 for 25.00 USD"  # frozen once FROZEN is added
OTHER = "Refund order A1002 for 15.00 USD"
LARGE = "Refund order A1004 for 75.00 USD"  # quorum 2
LATER = "Refund order A1003 for 20.00 USD"  # scheduled, frozen once FROZEN is added
EMAIL = "Email bob@example.com that his refund is on its way"
LATER_RULE = {"name": "later", "when": "args.order_id == 'A1003'", "action": "schedule", "at": 'now + duration("1h")'}
LARGE_RULE = {"name": "large refunds", "when": "args.amount_cents > 5000", "action": "ask", "quorum": 2}
FROZEN = {
    "name": "frozen",
    "when": "args.order_id in ['A1001', 'A1003']",
    "action": "deny",
    "reason": "refunds of these orders are frozen",
}
FINANCE = {"name": "finance", "when": "args.order_id == 'A1002'", "action": "ask", "approvers": ["finance"]}
PHONE = {"width": 390, "height": 844}
DENIED = "the policy now denies this call (rule 'frozen'"


def policy_text(*rules: dict[str, Any]) -> str:
    return support_yaml(rules=list(rules))


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("policy") / "agentfast.yaml"


@pytest.fixture(scope="module")
def _daphne(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory, policy_file: Path) -> Iterator[Daphne]:
    """This module's daphne, reading `policy_file` (its tests rewrite it)."""
    policy_file.write_text(policy_text(LATER_RULE, LARGE_RULE))
    env = child_env(
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost", AGENTFAST_LOG_LEVEL="WARNING", AGENTFAST_CONFIG=str(policy_file)
    )
    server = Daphne(log=tmp_path_factory.mktemp("daphne") / "daphne.log", env=env)
    server.start()
    server.wait_ready(timeout=20)
    yield server
    server.kill()


@pytest.fixture
def policy(policy_file: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Write the policy this process and the server read: the base rules, and any added."""
    monkeypatch.setenv("AGENTFAST_CONFIG", str(policy_file))

    def write(*added: dict[str, Any]) -> None:
        policy_file.write_text(policy_text(LATER_RULE, LARGE_RULE, *added))

    write()
    return write


def fits(seen: Viewer, name: str) -> None:
    """Take the page's screenshot and check that it is no wider than the screen."""
    seen.screenshot(name)
    width = seen.page.viewport_size["width"]
    assert seen.page.evaluate("document.documentElement.scrollWidth") <= width, name


@pytest.mark.parametrize("size", ["1280", "390"])
def test_it_says_on_the_card_why_the_policy_now_refuses_its_approval_and_lets_it_be_rejected(
    viewer: Callable[..., Viewer], policy: Callable[..., None], alice: User, size: str
) -> None:
    [approval] = pending(start(REFUND, auto_resume=False))
    policy(FROZEN)
    seen = viewer("alice", viewport=PHONE if size == "390" else None)
    page, card = seen.page, f"#card-{approval.id}"
    wait_live(page)

    page.keyboard.press("j")
    page.wait_for_selector(f"{card}.selected")
    page.keyboard.press("a")
    expect(page.locator(f"#card-status-{approval.id}")).to_contain_text("press a again")  # high risk: twice
    page.keyboard.press("a")

    expect(page.locator(f"{card} .notice")).to_contain_text(DENIED)
    fits(seen, f"refused-card-{size}")
    page.keyboard.press("r")  # the refused card is still the one selected
    page.keyboard.type("frozen: ask finance")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector(f"{card}.decided")
    approval.refresh_from_db()
    assert (approval.status, approval.note) == ("rejected", "frozen: ask finance")
    assert seen.errors == []


@pytest.mark.parametrize("size", ["1280", "390"])
def test_it_names_each_call_a_bulk_approval_left_undecided_and_shows_the_note_back(
    viewer: Callable[..., Viewer], policy: Callable[..., None], alice: User, size: str
) -> None:
    denied, fine, large = (pending(start(prompt, auto_resume=False))[0] for prompt in (REFUND, OTHER, LARGE))
    policy(FROZEN)
    seen = viewer("alice", viewport=PHONE if size == "390" else None)
    page = seen.page
    wait_live(page)
    for approval in (denied, fine, large):
        page.check(f"#card-{approval.id} input.pick")
    page.fill("#bulk-form input[name=note]", "checked with finance")

    page.click("#bulk-form button[value=approved]")

    assert page.inner_text("h1") == "1 of 3 approved"
    assert page.inner_text(".bulk-refused") == "1 call was not decided: why is said below."
    refused = page.locator(".bulk-results li.refused")
    expect(refused).to_contain_text("Refund 25.00 on A1001")  # which call, as its card said
    expect(refused).to_contain_text(DENIED)
    expect(page.locator(".unrecorded")).to_contain_text("checked with finance")
    fits(seen, f"refused-bulk-{size}")
    refused.locator("a").click()  # to the call, to reject it
    page.wait_for_url(f"**/approvals/{denied.id}")

    page.goto("/")
    wait_live(page)
    assert page.locator(f"#card-{denied.id}").count() == 1 and page.locator(f"#card-{large.id}").count() == 1
    assert page.locator(f"#card-{fine.id}").count() == 0
    assert [Approval.objects.get(pk=a.id).status for a in (denied, fine, large)] == ["pending", "approved", "pending"]
    assert Approval.objects.get(pk=fine.id).note == "checked with finance"
    assert seen.errors == []


@pytest.mark.parametrize("size", ["1280", "390"])
def test_it_keeps_a_card_whose_run_now_was_refused_within_the_keys_reach(
    viewer: Callable[..., Viewer], policy: Callable[..., None], alice: User, size: str
) -> None:
    [approval] = pending(start(LATER, auto_resume=False))
    assert approval.on_timeout == Approval.OnTimeout.RUN
    policy(FROZEN)
    seen = viewer("alice", viewport=PHONE if size == "390" else None)
    page, card = seen.page, f"#card-{approval.id}"
    wait_live(page)

    page.click(f"{card} [data-action=run-now]")

    expect(page.locator(f"#deadline-{approval.id} .notice")).to_contain_text(DENIED)
    fits(seen, f"refused-run-now-card-{size}")
    assert "deciding" not in page.get_attribute(card, "class")
    page.keyboard.press("j")
    wait_js(page, "s => document.querySelector(s).classList.contains('selected')", arg=card)
    page.keyboard.press("r")
    page.keyboard.type("frozen")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector(f"{card}.decided")
    assert Approval.objects.get(pk=approval.id).status == "rejected"

    policy()  # another scheduled call, refused on its page
    [approval] = pending(start(LATER, auto_resume=False))
    policy(FROZEN)
    page.goto(f"/approvals/{approval.id}")
    page.click(f"#deadline-{approval.id} [data-action=run-now]")
    expect(page.locator(f"#deadline-{approval.id} .notice")).to_contain_text(DENIED)
    fits(seen, f"refused-run-now-page-{size}")
    assert seen.errors == []


@pytest.mark.parametrize("size", ["1280", "390"])
def test_it_shows_back_what_a_reviewer_typed_once_they_are_no_longer_among_the_approvers(
    viewer: Callable[..., Viewer], policy: Callable[..., None], alice: User, size: str
) -> None:
    policy(FINANCE)
    services.user_set_groups(username="alice", groups=("finance",))
    on_page, on_card = (pending(start(OTHER, auto_resume=False))[0] for _ in range(2))
    seen = viewer("alice", path=f"/approvals/{on_page.id}", viewport=PHONE if size == "390" else None)
    page = seen.page
    page.fill("#id_note", "checked with the customer")
    services.user_set_groups(username="alice", groups=())  # meanwhile, an admin takes her out of finance

    page.click("#decision button[value=approved]")

    expect(page.locator("#decision .notice")).to_contain_text("finance")
    expect(page.locator("#decision .unrecorded")).to_contain_text("checked with the customer")
    fits(seen, f"refused-approver-page-{size}")

    services.user_set_groups(username="alice", groups=("finance",))
    page.goto("/")
    wait_live(page)
    card = f"#card-{on_card.id}"
    page.click(f"{card} [data-action=reject]")
    page.fill(f"{card} textarea[name=note]", "wrong order")
    services.user_set_groups(username="alice", groups=())
    page.click(f"{card} [data-label-reject]")
    expect(page.locator(f"{card} .notice")).to_contain_text("finance")
    expect(page.locator(f"{card} .unrecorded")).to_contain_text("wrong order")
    fits(seen, f"refused-approver-card-{size}")
    assert [Approval.objects.get(pk=a.id).status for a in (on_page, on_card)] == ["pending", "pending"]
    assert seen.errors == []


@pytest.mark.parametrize("size", ["1280", "390"])
def test_it_says_in_the_playground_why_the_policy_now_refuses_an_approval(
    viewer: Callable[..., Viewer], policy: Callable[..., None], alice: User, size: str
) -> None:
    seen = viewer("alice", path="/playground/", viewport=PHONE if size == "390" else None)
    seen.page.select_option("#pg-agent", "support")
    seen.page.fill("#pg-input", REFUND)
    seen.page.click("#pg-run")
    card = seen.page.locator(".pg-approval")
    expect(card).to_be_visible()
    policy(FROZEN)
    card.locator(".pg-note").fill("checked with finance")

    card.locator(".pg-approve").click()

    expect(card.locator(".pg-card-error")).to_contain_text(DENIED)
    expect(card.locator(".pg-note")).to_have_value("checked with finance")
    expect(card.locator(".pg-approval-status")).to_have_text("pending")
    fits(seen, f"refused-playground-{size}")
    card.locator(".pg-reject").click()
    expect(card.locator(".pg-approval-status")).to_have_text("rejected")
    assert Approval.objects.get().note == "checked with finance"
    assert seen.errors == []
