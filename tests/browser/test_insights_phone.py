"""The insights page's tables on a phone: headers and figures wrap between words, never inside one."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from tests.browser.conftest import Viewer
from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, start

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}

# Each word of the cell's text as a Range: a word that wraps inside itself has two line boxes.
SPLIT_WORDS = """cells => cells.flatMap(cell => {
  const text = cell.firstChild && cell.firstChild.nodeType === Node.TEXT_NODE ? cell.firstChild : null;
  if (!text) return [];
  const split = [];
  for (const match of text.data.matchAll(/\\S+/g)) {
    const range = document.createRange();
    range.setStart(text, match.index);
    range.setEnd(text, match.index + match[0].length);
    if (range.getClientRects().length > 1) split.push(match[0]);
  }
  return split;
})"""


def test_it_keeps_each_header_and_figure_whole_at_390_px(viewer: Callable[..., Viewer], alice: User) -> None:
    first, second, third = (pending(start(REFUND))[0] for _ in range(3))
    decide(first, "approved", by="alice")
    decide(second, "approved", by="alice", arguments={"order_id": "A1001", "amount_cents": 2000})
    decide(third, "rejected", by="bob", note="no")
    phone = viewer("alice", path="/insights", viewport=PHONE)
    page = phone.page
    expect(page.locator(".rates-table")).to_have_count(3)

    split = page.locator(".figures th, .figures td:not(:first-child)").evaluate_all(SPLIT_WORDS)

    phone.screenshot("insights-headers-390")
    assert split == []
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert phone.errors == []
