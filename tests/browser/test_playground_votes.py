"""The playground's inline approval card, when a quorum vote edits the call it shows."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from agents.models import Approval, SideEffect
from tests.browser.conftest import Viewer
from tests.conftest import wait_for
from tests.support.flows import decide

pytestmark = pytest.mark.browser


def test_it_never_approves_in_the_playground_arguments_another_voter_edited_after_the_card_showed_them(
    viewer: Callable[..., Viewer], alice: User, bob: User
) -> None:
    seen = viewer("alice", path="/playground/")
    page = seen.page
    page.select_option("#pg-agent", "support")
    page.fill("#pg-input", "Refund order A1010 for 60.00 USD")  # 6000 cents: agentfast.yaml asks for two approvals
    page.click("#pg-run")
    card = page.locator(".pg-approval")
    expect(card).to_be_visible()
    expect(page.locator("#pg-status")).to_have_text("suspended")
    expect(card.locator(".pg-args")).to_contain_text('"amount_cents": 6000')
    approval = Approval.objects.get()
    assert approval.quorum == 2

    # Another reviewer votes with an edit: the call now asks for 990.00 USD.
    decide(approval, "approved", by="bob", arguments={"order_id": "A1010", "amount_cents": 99000})
    wait_for(lambda: "approval_voted" in page.locator("#pg-raw-log").inner_text(), what="the vote to reach the page")

    # The card still shows 6000; the developer approves what they see.
    expect(card.locator(".pg-args")).to_contain_text('"amount_cents": 6000')
    card.locator(".pg-approve").click()
    wait_for(
        lambda: (
            SideEffect.objects.exists()
            or card.locator(".pg-card-error").is_visible()
            or card.locator(".pg-decided").is_visible()
        ),
        what="the decision's answer",
    )

    # Refused as the inbox card would be: the arguments changed since the card showed them.
    expect(card.locator(".pg-card-error")).to_contain_text("changed")
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING and not SideEffect.objects.exists()
