"""`python -m bench.dashboard_latency`: what a reviewer feels, measured in real Chromium.

Two latencies, over --pauses runs (default 100, after 5 warm-up runs), one run at a time:

  pause → card    a run is created and enqueued; a real Celery worker drives it until it
                  suspends on send_email; the approval_required event reaches a real daphne
                  process over Redis, whose inbox consumer pushes the card; htmx inserts it.
                  From the Approval row's created_at (set by its INSERT inside the
                  suspending transaction, so at most a moment before the commit: the figure
                  errs high) to a MutationObserver's Date.now() when the card node is
                  inserted into the page.
  click → effect  the card's Approve button is clicked in the page (Date.now() taken just
                  before element.click()); htmx POSTs the decision, the view's service
                  enqueues the resume on commit, the worker resumes the run and send_email
                  writes its SideEffect row (an autocommit INSERT: created_at is its commit
                  time, to the millisecond). To that row's created_at.

Browser, server, worker and this process share one machine and so one wall clock, which
is what makes the Python and JavaScript timestamps comparable (both are Unix epoch ms).

Everything lives in var/bench-dashboard/ (bench.setup's helpers: a fresh SQLite database,
or DATABASE_URL naming a database with "bench" in its name; a private Redis; the worker).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench import setup
from tests.support.processes import CHROMIUM, CHROMIUM_ARGS

VAR_DIR = setup.ROOT / "var" / "bench-dashboard"
REVIEWER, PASSWORD = "bench-reviewer", "plum-harbour-lantern-42"  # passes the password validators
CALL_ID = "call_1_1"  # the demo model's first call: the bench agent's send_email

# Installed before the inbox's scripts run: note when each card enters the page.
OBSERVER = """
window.__cardSeenAt = {};
new MutationObserver((records) => {
  const now = Date.now();
  for (const record of records) {
    for (const node of record.addedNodes) {
      if (node.nodeType === 1 && node.matches('article.card') && !(node.dataset.approval in window.__cardSeenAt)) {
        window.__cardSeenAt[node.dataset.approval] = now;
      }
    }
  }
}).observe(document, {childList: true, subtree: true});
"""
CLICK = """(approvalId) => {
  const button = document.querySelector(`#card-${approvalId} [data-action=approve]`);
  const at = Date.now();
  button.click();
  return at;
}"""


@dataclass
class Samples:
    pause_to_card: list[float] = field(default_factory=list)
    click_to_effect: list[float] = field(default_factory=list)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pauses", type=int, default=100, help="timed runs (default 100)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    args = parser.parse_args(argv)
    if args.pauses < 1 or args.warmup < 0:
        parser.error("--pauses must be at least 1 and --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not CHROMIUM.exists():
        print(f"bench: Chromium is not installed at {CHROMIUM}", file=sys.stderr)
        return 1
    # A folder of its own (database, Redis socket, logs): `python -m bench` recreates
    # var/bench/ when it starts, and may run at the same time.
    setup.VAR_DIR = VAR_DIR
    return setup.run(_main, args)


def _main(args: argparse.Namespace) -> int:
    target = setup.prepare()
    # Playwright's sync API runs an event loop in this thread; the ORM calls made here
    # block plainly and share nothing with it.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    setup.start_redis()
    _django(target)
    # The server keeps Django's async guard that this process had to lift.
    server = setup.start_daphne(
        VAR_DIR / "dashboard-daphne.log", DJANGO_ALLOWED_HOSTS="127.0.0.1", DJANGO_ALLOW_ASYNC_UNSAFE=""
    )
    try:
        samples = _measure(args, server.url)
    finally:
        server.stop()
    print(_report(samples, target, args))
    return 0


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _django(target: setup.Target) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    from agents import services

    _progress(f"migrating a fresh {target.engine} database ({target.label})")
    call_command("migrate", verbosity=0, interactive=False)
    services.user_create(username=REVIEWER, role="reviewer", password=PASSWORD)
    _progress("starting a Celery worker")
    setup.start_worker(VAR_DIR / "dashboard-worker.log")


# -- the measurement ---------------------------------------------------------------------


def _measure(args: argparse.Namespace, url: str) -> Samples:
    from playwright.sync_api import sync_playwright

    samples = Samples()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = _inbox(browser, url)
            _progress(f"{args.pauses} pauses and approvals (+{args.warmup} warm-up), one at a time")
            for index in range(args.warmup + args.pauses):
                card_ms, effect_ms = _one_round_trip(page)
                if index >= args.warmup:
                    samples.pause_to_card.append(card_ms)
                    samples.click_to_effect.append(effect_ms)
        finally:
            browser.close()
    return samples


def _inbox(browser: Any, url: str) -> Any:
    """Sign the reviewer in and return their inbox page, live."""
    page = browser.new_context(base_url=url, viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(15_000)
    page.goto("/accounts/login/")
    page.fill("#id_username", REVIEWER)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/")
    page.add_init_script(OBSERVER)
    page.reload()
    page.wait_for_selector(".live[data-state=open]")
    return page


def _one_round_trip(page: Any) -> tuple[float, float]:
    """Pause one run in the worker, see its card, click Approve, wait for the effect."""
    from agents import ids, services
    from agents.models import Approval, SideEffect

    run = services.run_create(agent=setup.AGENT, input=setup.PROMPT, created_by="bench")
    approval_id = ids.approval_id(run.id, CALL_ID)
    page.wait_for_function("(id) => id in window.__cardSeenAt", arg=approval_id)
    seen_ms = page.evaluate("(id) => window.__cardSeenAt[id]", approval_id)
    created = Approval.objects.values_list("created_at", flat=True).get(pk=approval_id)
    clicked_ms = page.evaluate(CLICK, approval_id)
    effect_at = _wait_for_effect(approval_id, SideEffect)
    return seen_ms - created.timestamp() * 1000, effect_at.timestamp() * 1000 - clicked_ms


def _wait_for_effect(approval_id: str, model: Any, timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        created = model.objects.filter(idempotency_key=approval_id).values_list("created_at", flat=True).first()
        if created is not None:
            return created
        time.sleep(0.002)
    raise setup.BenchError(f"no side effect for {approval_id} {timeout}s after its approval")


# -- the report --------------------------------------------------------------------------


def _percentile(values: list[float], fraction: float) -> float:
    """Nearest rank: the smallest sample with at least `fraction` of the samples at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def _line(label: str, values: list[float]) -> str:
    return (
        f"{label:<34}{_percentile(values, 0.50):>9.1f}{_percentile(values, 0.95):>9.1f}"
        f"{min(values):>9.1f}{max(values):>9.1f}{statistics.fmean(values):>9.1f}"
    )


def _report(samples: Samples, target: setup.Target, args: argparse.Namespace) -> str:
    title = (
        f"agentfast dashboard latency: {args.pauses} pauses (+{args.warmup} warm-up), one at a time; "
        f"{target.engine} ({target.label}), Celery worker --pool=solo, daphne, headless Chromium; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    return "\n".join(
        [
            title,
            f"{'ms':<34}{'p50':>9}{'p95':>9}{'min':>9}{'max':>9}{'mean':>9}",
            _line("pause committed → card in page", samples.pause_to_card),
            _line("click Approve → side effect", samples.click_to_effect),
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
