"""`agentfast runs`: start, list, show, resume and cancel."""

from __future__ import annotations

import argparse
import getpass
import time
from typing import Any

from agents.cli.output import (
    CliError,
    ago,
    attempt,
    command,
    compact,
    count,
    cut,
    echo,
    person,
    print_json,
    print_table,
    seconds,
)

# The statuses of agents.models.Run, spelled here so `--help` works before Django is set up.
RUN_STATUSES = ("queued", "running", "suspended", "completed", "failed", "cancelled")
WAIT_STATUSES = ("suspended", "completed", "failed", "cancelled")


def register(groups: Any) -> None:
    """Add the `runs` group."""
    actions = groups.add_parser("runs", help="start, list, show and resume runs").add_subparsers(metavar="ACTION")
    start = command(actions, "start", _start, "start a run of an agent", json_flag=True)
    start.add_argument("--agent", required=True)
    start.add_argument("prompt")
    start.add_argument("--wait", action="store_true", help="wait until the run is suspended or finished")
    start.add_argument("--timeout", type=seconds, default=60, help="seconds --wait waits (default 60)")
    start.add_argument("--inline", action="store_true", help="drive the run in this process, without a worker")
    start.add_argument("--no-auto-resume", action="store_true", help="decisions do not resume the run by themselves")
    start.add_argument("--by", default="", help="who starts the run (default: your login)")
    listing = command(actions, "list", _list, "list runs", json_flag=True)
    listing.add_argument("--status", choices=(*RUN_STATUSES, "all"))
    listing.add_argument("--agent")
    listing.add_argument("--limit", type=count, default=50)
    show = command(actions, "show", _show, "show a run: messages, tool calls, approvals", json_flag=True)
    show.add_argument("id")
    resume = command(actions, "resume", _resume, "resume a run whose approvals are decided", json_flag=True)
    resume.add_argument("id")
    resume.add_argument("--inline", action="store_true", help="drive the run in this process")
    cancel = command(actions, "cancel", _cancel, "cancel a run; its pending approvals expire", json_flag=True)
    cancel.add_argument("id")
    cancel.add_argument("--by", required=True)


def _start(args: argparse.Namespace) -> None:
    from agents import runtime, selectors, services

    created_by = selectors.username_as_spelled(person(args.by or getpass.getuser()))
    if not args.inline:
        _require_broker()
    run = services.run_create(
        agent=args.agent,
        input=args.prompt,
        created_by=created_by,
        started_from="cli",
        auto_resume=not args.no_auto_resume,
        enqueue=not args.inline,
    )
    if args.inline:
        runtime.drive(run.id)
    elif args.wait:
        try:
            _wait(run.id, args.timeout)
        except CliError:
            if args.json:  # the run exists: a script reading stdout must still learn its id
                print_json(_as_json(selectors.run_get(run.id)))
            raise
    run = selectors.run_get(run.id)
    if args.json:
        return print_json(_as_json(run))
    echo(f"{run.id} {run.status}")
    _print_outcome(run)
    return None


def _as_json(run: Any) -> dict[str, str]:
    return {"id": run.id, "status": run.status}


def _require_broker() -> None:
    from agents import queue

    reachable, url = queue.broker_reachable()
    if not reachable:
        raise CliError(
            f"cannot reach the broker at {url}: start it with `make run`, "
            "or pass --inline to drive the run in this process"
        )


def _wait(run_id: str, timeout: float) -> None:
    from agents import selectors

    deadline = time.monotonic() + timeout
    while selectors.run_get(run_id).status not in WAIT_STATUSES:
        if time.monotonic() > deadline:
            raise CliError(
                f"{run_id} did not pause or finish within {timeout:g}s; is a worker running? "
                f"(see `agentfast runs show {run_id}`)"
            )
        time.sleep(0.05)


def _print_outcome(run: Any) -> None:
    if run.status == "suspended":
        from django.utils import timezone

        from agents import selectors

        waiting = list(selectors.run_approvals_waiting(run))
        for approval in waiting:
            echo(f"waiting on {approval.id} ({approval.tool} {compact(approval.tool_call.arguments, 60)})")
        if waiting:
            echo("decide with: agentfast approvals approve|reject <id> --by <you>")
        elif held := selectors.run_held_until([run.id], timezone.now()).get(run.id):
            # A decided call its tool put off: nothing to decide, the run goes on at that time.
            echo(f"decided; waits until {held:%Y-%m-%d %H:%M:%S} UTC for its tool's time, then runs")
    elif run.status == "completed":
        echo(run.output)
    elif run.status == "failed":
        echo(f"error: {run.error}")


def _list(args: argparse.Namespace) -> None:
    from agents import schemas, selectors

    runs = selectors.run_list(status=args.status, agent=args.agent)[: args.limit]
    rows = [schemas.RunSummary.of(r).as_json() for r in runs]
    if args.json:
        return print_json(rows)
    if not rows:
        echo('No runs. Start one with: agentfast runs start --agent support "Refund order A1001 for 25.00 USD"')
        return None
    print_table(
        ["ID", "AGENT", "STATUS", "STARTED", "INPUT"],
        [[r["id"], r["agent"], r["status"], ago(r["created_at"]), cut(r["input"], 50)] for r in rows],
    )
    return None


def _show(args: argparse.Namespace) -> None:
    from agents import schemas, selectors

    detail = schemas.RunDetail.of(selectors.run_get(args.id)).as_json()
    if args.json:
        return print_json(detail)
    echo(f"{detail['id']}  agent={detail['agent']}  status={detail['status']}")
    if detail["error"]:
        echo(f"error: {detail['error']}")
    echo("\nconversation:")
    for message in detail["messages"]:
        echo(f"  {message['seq']:>3} {message['role']:<9} {cut(_message_text(message), 110)}")
    if detail["tool_calls"]:
        echo("\ntool calls:")
        rows = [
            [
                c["call_id"],
                c["name"],
                c["status"] + (" (IN DOUBT)" if c["in_doubt"] else "") + _held_note(c),
                compact(c["executed_arguments"] or c["arguments"], 50),
            ]
            for c in detail["tool_calls"]
        ]
        print_table(["CALL", "TOOL", "STATUS", "ARGUMENTS"], rows, indent="  ")
    if detail["approvals"]:
        echo("\napprovals:")
        rows = [
            [a["id"], a["mode"], a["status"], a["decided_by"] or "", cut(a["note"], 40)] for a in detail["approvals"]
        ]
        print_table(["ID", "MODE", "STATUS", "BY", "NOTE"], rows, indent="  ")
    return None


def _held_note(call: dict[str, Any]) -> str:
    """Say until when a decided call its tool put off waits (as the run page does); else nothing."""
    from datetime import datetime

    from django.utils import timezone

    if call["result"] is not None or not call["not_before"]:
        return ""
    when = datetime.fromisoformat(call["not_before"])
    return f" (waits until {when:%Y-%m-%d %H:%M:%S} UTC)" if when > timezone.now() else ""


def _message_text(message: dict[str, Any]) -> str:
    text = message["content"] or ""
    if message["tool_calls"]:
        calls = ", ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in message["tool_calls"])
        text = (text + " " if text else "") + f"→ {calls}"
    return text


def _resume(args: argparse.Namespace) -> None:
    from agents import runtime, selectors, services

    if not args.inline:
        _require_broker()
    run = services.run_request_resume(run_id=args.id, enqueue=not args.inline)
    if args.inline:
        runtime.drive(run.id)
        run = selectors.run_get(run.id)
    if args.json:
        return print_json({"id": run.id, "status": run.status})
    echo(f"{run.id} {run.status}" + ("" if args.inline else " (resume enqueued)"))
    if args.inline:
        _print_outcome(run)
    return None


def _cancel(args: argparse.Namespace) -> None:
    from agents import services

    run = services.run_cancel(run_id=args.id, attempt=attempt(args.by))
    if args.json:
        return print_json({"id": run.id, "status": run.status})
    echo(f"{run.id} cancelled")
    return None
