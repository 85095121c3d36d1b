"""The Content-Security-Policy in real Chromium: the pages outside the dashboard work under it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.browser.conftest import Viewer

pytestmark = pytest.mark.browser


def console_of(seen: Viewer) -> list[str]:
    """Return the list that collects the page's console messages (Chromium reports CSP violations there)."""
    messages: list[str] = []
    seen.page.on("console", lambda message: messages.append(message.text))
    return messages


def test_it_renders_sign_in_and_the_api_docs_with_no_policy_violation(carol, viewer: Callable[..., Viewer]) -> None:
    seen = viewer("carol")  # signed in through the login page, which must work under the policy
    messages = console_of(seen)

    response = seen.page.goto("/api/docs")
    seen.page.wait_for_selector(".swagger-ui .opblock")  # Swagger UI's script ran and drew the API
    seen.page.goto("/admin/")
    seen.page.goto("/no/such/page")

    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert [m for m in messages if "Content Security Policy" in m] == []
    assert seen.errors == []
