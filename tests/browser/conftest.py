"""Fixtures for tests in real Chromium: a daphne server, a browser, signed-in viewers.

- `live_server`: a real `daphne` process serving dashboard.asgi on a free port, against the
  test database and the test run's Redis (tests.conftest.child_env), so HTTP, websockets
  and the channel layer are the production ones; one per test module, started again for a
  test if an earlier one killed it. Needs `transactional_db` (it requests it): the server
  process only sees committed rows. It reads the project's agentfast.yaml, not a test's
  `agent_config`. A tests.support.processes.Daphne: `.url`,
  `.kill()` then `.start()` and `.wait_ready()` (a restart on the same port, to drop every
  websocket).
- `browser`: one headless Chromium (/usr/bin/chromium, driven by Playwright) per module.
  Without Chromium the tests skip locally and fail when CI is set.
- `viewer`: `viewer("alice")` opens a new browser context (its own cookies), signs in
  through the login form with the fixture users' password `<name>-password`, and returns
  a `Viewer` whose `dialogs` and `errors` lists record alert()/confirm() dialogs and
  uncaught page errors, for tests to assert that no script ran. `viewer("bob",
  viewport={"width": 390, "height": 844})` is a phone. `screenshot(page, name)` saves
  artifacts/screenshots/<name>.png (gitignored; CI keeps it as an artifact).

Every browser test is marked `@pytest.mark.browser`; a start-to-finish flow also needs a
worker: request `start_worker` (tests/conftest.py) and call it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import child_env
from tests.support.processes import CHROMIUM, CHROMIUM_ARGS, ROOT, Daphne

SCREENSHOTS = ROOT / "artifacts" / "screenshots"


@pytest.fixture(autouse=True)
def _live_server_helper() -> None:
    """Replace pytest-django's hook for its own in-process live_server, which this one replaces.

    Ours runs in another process, so there are no settings of this process to swap in.
    """


@pytest.fixture(scope="module")
def _daphne(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    """One daphne per test module: starting one costs seconds of CPU, and it keeps no state of
    its own between tests (each test gets an emptied database and Redis)."""
    env = child_env(DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost", AGENTFAST_LOG_LEVEL="WARNING")
    server = Daphne(log=tmp_path_factory.mktemp("daphne") / "daphne.log", env=env)
    server.start()
    server.wait_ready(timeout=20)
    yield server
    server.kill()


@pytest.fixture
def live_server(transactional_db: None, _daphne: Daphne) -> Daphne:
    _daphne.ensure_running()  # an earlier test may have killed it
    return _daphne


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread, which makes Django
    # refuse ORM calls from the test. They are plain blocking calls with no coroutine
    # sharing the connection, so allow them, for this module's tests only.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@dataclass
class Viewer:
    """One person's browser context and page, with what happened in it that should not."""

    context: Any
    page: Any
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def screenshot(self, name: str) -> Path:
        return screenshot(self.page, name)


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as artifacts/screenshots/<name>.png, animations finished."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True, animations="disabled")
    return path


@pytest.fixture
def viewer(browser: Any, live_server: Daphne) -> Iterator[Callable[..., Viewer]]:
    contexts: list[Any] = []

    def open_as(username: str, *, path: str = "/", viewport: dict[str, int] | None = None) -> Viewer:
        context = browser.new_context(base_url=live_server.url, viewport=viewport or {"width": 1280, "height": 860})
        context.set_default_timeout(10_000)
        contexts.append(context)
        page = context.new_page()
        seen = Viewer(context=context, page=page)
        page.on("dialog", lambda dialog: (seen.dialogs.append(dialog.message), dialog.dismiss()))
        page.on("pageerror", lambda error: seen.errors.append(str(error)))
        page.goto(f"/accounts/login/?next={path}")
        page.fill("#id_username", username)
        page.fill("#id_password", f"{username}-password")
        page.click("button[type=submit]")
        page.wait_for_url(live_server.url + path)
        return seen

    yield open_as
    for context in contexts:
        context.close()


def wait_js(page: Any, expression: str, arg: Any = None, *, timeout: float = 10) -> None:
    """Wait until a JavaScript expression (or `arg => …` function) is truthy in the page.

    Not Playwright's wait_for_function: it evaluates its predicate with eval, which the
    pages' Content-Security-Policy (no 'unsafe-eval') refuses once it has to poll.
    """
    from tests.conftest import wait_for

    wait_for(lambda: page.evaluate(expression, arg), timeout=timeout, what=f"the page to satisfy {expression}")


def wait_live(page: Any) -> None:
    """Wait until the page's websocket is open and the list it re-fetches on opening has landed.

    The live dot turns green on the socket's open event, which also sends the list's re-fetch
    (hx-trigger="htmx:wsOpen"). Acting before that answer lands races it: the answer swaps
    every card anew, dropping the keyboard selection and any decision's reply that targeted
    the old card, and a card created meanwhile arrives in it, not as an announced push.
    """
    page.wait_for_selector(".live[data-state=open]")
    wait_js(page, "!document.querySelector('.htmx-request')")
