"""Back after leaving a live page shows the full page again, never the htmx fragment that the
page's live list re-fetched under the same URL (issue 7, item 18)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.flows import pending, start

pytestmark = pytest.mark.browser

REFUND = "Refund order A1001 for 25.00 USD"
PAGE_BACKGROUND = "rgb(246, 248, 250)"  # app.css's --bg on <body>: the stylesheet is applied


def is_htmx_refetch(path: str) -> Any:
    return lambda response: response.request.headers.get("hx-request") == "true" and response.url.endswith(path)


def assert_full_page(page: Any) -> None:
    assert page.locator("header.topbar .brand").is_visible()
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == PAGE_BACKGROUND


def test_it_shows_the_styled_inbox_after_back_from_an_approval(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    page = viewer("alice", path="/runs").page
    with page.expect_response(is_htmx_refetch("/")):  # the socket opens, the list is re-fetched
        page.goto("/")
    page.click(f"#card-{approval.id} [data-action=open]")
    page.wait_for_selector("#decision")

    page.go_back()

    page.wait_for_selector(f"#card-{approval.id}")
    assert_full_page(page)


def test_it_shows_the_styled_run_page_after_back_from_an_approval(viewer, alice):
    [approval] = pending(start(REFUND, auto_resume=False))
    page = viewer("alice", path="/runs").page
    with page.expect_response(is_htmx_refetch(f"/runs/{approval.run_id}")):
        page.goto(f"/runs/{approval.run_id}")
    page.click("#timeline a:has-text('open the approval')")
    page.wait_for_selector("#decision")

    page.go_back()

    page.wait_for_selector("#timeline .event")
    assert_full_page(page)
