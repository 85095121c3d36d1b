"""The playground and a decided call whose tool asks to run later: it waits for that time, then resumes the run."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from agents import runtime, services
from agents.models import Run, SideEffect
from tests.browser.conftest import Viewer
from tests.support.flows import charge_later

pytestmark = pytest.mark.browser

WAIT = timedelta(seconds=5)  # longer than the page takes to open the run, on a loaded machine too


def test_it_resumes_a_held_call_at_its_time_and_not_over_and_over_before(
    viewer: Callable[..., Viewer], alice: User, fake_openai
) -> None:
    seen = viewer("alice", path="/playground/")  # signed in first: the time below starts once the page is up
    page = seen.page
    later = datetime.now(UTC) + WAIT
    fake_openai.script(charge_later(later))
    # The page's server reads the project's agentfast.yaml: the run carries its agent, as a composed one does.
    agent = {
        "model": "openai:test-model",
        "base_url": fake_openai.base_url,
        "tools": ["charge_after_hours"],
        "tool_overrides": {"charge_after_hours": {"risk": "high"}},
    }
    run = services.run_create(
        agent="playground-held",
        input="charge c1 tonight",
        created_by="alice",
        auto_resume=False,
        enqueue=False,
        agent_config=agent,
        started_from="playground",
    )
    runtime.drive(run.id, stream=False)
    page.goto(f"/playground/?run={run.id}")
    resumes: list[datetime] = []  # when the page asked to resume the run
    page.on("request", lambda r: resumes.append(datetime.now(UTC)) if "/resume" in r.url else None)

    page.locator(".pg-approve").click()
    expect(page.locator(".pg-held")).to_contain_text("Waits until")
    # Waited for by Playwright, which hands the page's requests to the handler above as they go out.
    expect(page.locator("#pg-status")).to_have_text("completed", timeout=30_000)

    # Once after the decision (which held the call), then at the time: not again and again before it.
    assert len([moment for moment in resumes if moment < later]) == 1, resumes
    assert SideEffect.objects.get(tool="charge_after_hours").created_at >= later
    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPLETED
    assert len(resumes) <= 3 and seen.errors == []
