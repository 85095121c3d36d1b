"""Words longer than a line (a pasted token, a note without spaces) wrap inside their card in real Chromium."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from tests.browser.conftest import Viewer
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
