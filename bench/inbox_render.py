"""`python -m bench.inbox_render`: the inbox with 1,000 pending cards, as a reviewer opens it.

Clones a run the engine really paused (`--pending` times, as bench.scale does), then times
each inbox view `--repeat` times through Django's test client, signed in as a reviewer:
the first page (oldest first), newest first, a search, every agent, and one page holding
every card (the cost of rendering the cards themselves). Prints p50/p95 in ms; asserts nothing.
SQLite in var/bench/ by default; DATABASE_URL naming a database containing "bench" for Postgres.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from bench import setup


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.inbox_render", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=1000, help="pending approvals (default 1000)")
    parser.add_argument("--repeat", type=int, default=20, help="timed requests of each page (default 20)")
    args = parser.parse_args(argv)
    if min(args.pending, args.repeat) < 1:
        parser.error("--pending and --repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return setup.run(_main, parse_args(argv))


def _main(args: argparse.Namespace) -> int:
    target = setup.prepare()
    setup.start_redis()
    from bench import scale

    with setup.django_migrated(target):
        print(_render(_run(args, scale), target, args))
    return 0


def _run(args: argparse.Namespace, scale: Any) -> dict[str, dict[str, Any]]:
    from agents import services
    from bench import measure
    from dashboard.web import inbox

    scale.progress(f"building {args.pending:,} paused runs with a pending approval each")
    template = measure.paused_run()
    scale._clone_runs(template, args.pending - 1)
    reviewer, _ = services.user_create(username="bench-reviewer", role="reviewer")
    client = scale._client(reviewer)
    pages = {
        "inbox, first page (oldest first)": "/",
        "inbox, newest first": "/?order=newest",
        "inbox, search (q=A1001 refund)": "/?q=A1001+refund",
        "inbox, every agent (show=all)": "/?show=all",
        "inbox, page 10": "/?page=10",
    }
    results = {label: scale._time_page(client, url, args.repeat) for label, url in pages.items()}
    # Every card on one page: what the cards themselves cost to render.
    size, inbox.INBOX_PAGE_SIZE = inbox.INBOX_PAGE_SIZE, args.pending
    try:
        results[f"inbox, all {args.pending:,} cards on one page"] = scale._time_page(client, "/", args.repeat)
    finally:
        inbox.INBOX_PAGE_SIZE = size
    return results


def _render(results: dict[str, dict[str, Any]], target: setup.Target, args: argparse.Namespace) -> str:
    lines = [
        f"inbox render, {args.pending:,} pending approvals, {target.engine} ({target.label}), cpus {os.cpu_count()}"
    ]
    for label, figures in results.items():
        lines.append(
            f"  {label:<45} p50 {figures['p50_ms']:8.1f} ms   p95 {figures['p95_ms']:8.1f} ms   {figures['bytes'] / 1024:8.0f} KiB"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
