"""The standing decisions page in real Chromium: a phone sees every grant and its Revoke button."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from agents import services
from agents.models import Grant
from tests.browser.conftest import Viewer
from tests.support.flows import decide, pending, start

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}


def test_it_fits_a_phone_and_revokes_from_it(viewer: Callable[..., Viewer], alice: User) -> None:
    [approval] = pending(start("Email bob@example.com that his refund is on its way"))
    decide(approval, "approved", by="alice", remember=services.Remember(scope="exact", seconds=3600))
    phone = viewer("alice", path="/grants", viewport=PHONE)
    page = phone.page
    revoke = page.get_by_role("button", name="Revoke")

    phone.screenshot("grants-390")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    box = revoke.bounding_box()
    assert box is not None and box["x"] + box["width"] <= PHONE["width"]

    revoke.click()

    expect(page.get_by_role("button", name="Revoke")).to_have_count(0)
    assert Grant.objects.get().revoked_at is not None
    assert phone.errors == []
