"""Runs, insights, dark mode and saved agents in real Chromium, with screenshots at 1280 and 390 px."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from agents import services
from agents.models import Run, SideEffect
from tests.browser.conftest import Viewer
from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, start

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}


def test_it_searches_and_filters_runs_and_shows_times_in_the_viewers_zone(
    viewer: Callable[..., Viewer], alice: User
) -> None:
    refund = start(REFUND)
    hello = services.run_create(agent="support", input="hello there", created_by="carol", enqueue=False)
    failed = services.run_create(agent="support", input="this one breaks", created_by="bob", enqueue=False)
    services.run_fail(run_id=failed.id, owner=None, error="the model endpoint refused the key")
    seen = viewer("alice", path="/runs")
    page = seen.page

    rows = page.locator("tr.run-row")
    expect(rows).to_have_count(3)
    failed_row = page.locator(f'tr[data-run-id="{failed.id}"] td').first
    assert failed_row.evaluate("cell => getComputedStyle(cell).backgroundColor") != "rgba(0, 0, 0, 0)"
    started = page.locator(f'tr[data-run-id="{refund.id}"] time[data-local]')
    expect(started).not_to_contain_text("UTC")  # localized by static/js, in the viewer's zone
    seen.screenshot("runs-1280")

    page.fill("input[name=q]", "A1001")
    page.click(".runs-filters button[type=submit]")
    expect(rows).to_have_count(1)
    expect(rows.first.locator(".run-link")).to_have_text(REFUND)
    page.goto("/runs")
    page.select_option("select[name=creator]", "carol")  # data-autosubmit
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-run-id", hello.id)

    phone = viewer("alice", path="/runs", viewport=PHONE)
    expect(phone.page.locator("tr.run-row")).to_have_count(3)
    phone.screenshot("runs-390")
    assert seen.errors == [] and phone.errors == []


def test_it_opens_a_run_on_its_summary_and_cancels_it(viewer: Callable[..., Viewer], alice: User) -> None:
    run = start(REFUND)
    [approval] = pending(run)
    seen = viewer("alice", path=f"/runs/{run.id}")
    page = seen.page

    summary = page.locator("#run-summary")
    expect(summary.locator(".badge")).to_have_text("suspended")
    expect(summary.get_by_role("link", name="Decide refund_request")).to_have_attribute(
        "href", f"/approvals/{approval.id}"
    )
    seen.screenshot("run-1280")
    phone = viewer("alice", path=f"/runs/{run.id}", viewport=PHONE)
    phone.screenshot("run-390")

    summary.get_by_role("button", name="Cancel run").click()

    expect(page.locator("#run-summary .badge").first).to_have_text("cancelled")
    expect(page.get_by_role("button", name="Cancel run")).to_have_count(0)
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert seen.errors == []


def test_it_draws_insights_with_the_numbers_of_known_decisions(viewer: Callable[..., Viewer], alice: User) -> None:
    first, second, third = (pending(start(REFUND))[0] for _ in range(3))
    decide(first, "approved", by="alice")
    decide(second, "approved", by="alice", arguments={"order_id": "A1001", "amount_cents": 2000})
    decide(third, "rejected", by="bob", note="no")
    seen = viewer("alice", path="/insights")
    page = seen.page

    expect(page.locator("#decision-count")).to_have_text("3")
    alice_row = page.locator('[data-by="by-reviewer"] tr[data-name="alice"]')
    expect(alice_row.locator(".approved")).to_have_text("1")
    expect(alice_row.locator(".edited")).to_have_text("1")
    bars = page.locator("#rates svg").first.locator("rect")
    assert sorted(bars.evaluate_all("rects => rects.map(r => r.getAttribute('class') + ':' + r.dataset.count)")) == [
        "approved:1",
        "edited:1",
        "rejected:1",
    ]
    expect(page.locator('.latency-tool[data-tool="refund_request"] svg polyline.p50')).to_have_count(1)
    seen.screenshot("insights-1280")
    phone = viewer("alice", path="/insights", viewport=PHONE)
    phone.screenshot("insights-390")
    assert seen.errors == [] and phone.errors == []


def test_it_follows_the_systems_dark_mode(viewer: Callable[..., Viewer], alice: User) -> None:
    seen = viewer("alice", path="/runs")
    light = seen.page.evaluate("getComputedStyle(document.body).backgroundColor")

    seen.page.emulate_media(color_scheme="dark")

    dark = seen.page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert (light, dark) == ("rgb(246, 248, 250)", "rgb(13, 17, 23)")
    seen.screenshot("runs-dark-1280")


def test_it_saves_a_composed_agent_and_runs_it_when_picked(viewer: Callable[..., Viewer], alice: User) -> None:
    seen = viewer("alice", path="/playground/")
    page = seen.page
    page.select_option("#pg-agent", "__compose__")
    page.check("input[name=tools][value=lookup_order]")
    page.fill("#pg-agent-name", "order lookups")
    page.click("#pg-save")

    expect(page.locator("#pg-save-result")).to_contain_text("Saved as “order lookups”")
    expect(page.locator("#pg-agent option:checked")).to_have_text("order lookups")
    page.reload()
    page.select_option("#pg-agent", label="order lookups")
    expect(page.locator("#pg-agent-info")).to_contain_text("lookup_order")
    page.fill("#pg-input", "hello")
    page.click("#pg-run")

    expect(page.locator("#pg-status")).to_have_text("completed")
    expect(page.locator("#pg-history li").first).to_contain_text("order lookups")
    run = Run.objects.get()
    assert run.agent_config["tools"] == ["lookup_order"] and run.agent_config["description"] == "order lookups"
    seen.screenshot("playground-1280")
    phone = viewer("alice", path="/playground/", viewport=PHONE)
    phone.screenshot("playground-390")
    assert seen.errors == [] and phone.errors == []


def test_it_shows_a_reviewers_edits_on_the_playground_card(viewer: Callable[..., Viewer], alice: User) -> None:
    seen = viewer("alice", path="/playground/")
    page = seen.page
    page.select_option("#pg-agent", "support")
    page.fill("#pg-input", REFUND)
    page.click("#pg-run")
    card = page.locator(".pg-approval")
    expect(card).to_be_visible()

    card.locator(".pg-edit summary").click()
    card.locator(".pg-edit-args").fill('{"order_id": "A1001", "amount_cents": 2000}')
    card.locator(".pg-approve").click()

    edit = card.locator(".pg-edits li")
    expect(edit).to_have_count(1)
    expect(edit).to_have_text("amount_cents: 2500 → 2000")
    expect(page.locator("#pg-status")).to_have_text("completed")
    assert seen.errors == []


@pytest.mark.integration
def test_it_follows_an_approved_deferred_call_until_it_has_run(
    start_worker: Callable[..., object], viewer: Callable[..., Viewer], alice: User
) -> None:
    start_worker()
    seen = viewer("alice", path="/playground/")
    page = seen.page
    page.select_option("#pg-agent", "support")
    page.fill("#pg-input", "Email bob@example.com that his refund is on its way")
    page.click("#pg-run")
    card = page.locator(".pg-approval")
    expect(card.locator(".pg-mode")).to_have_text("defer")
    expect(page.locator("#pg-status")).to_have_text("completed")  # the run went on without the email

    card.locator(".pg-approve").click()

    # The worker sends it after the page's stream ended; the page keeps following the run until it has.
    expect(card.locator(".pg-result").last).to_contain_text('"status": "sent"', timeout=30_000)
    assert SideEffect.objects.filter(tool="send_email").count() == 1
    assert seen.errors == []
