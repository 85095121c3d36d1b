"""The `agentfast` command: decide approvals, start and inspect runs, and run the services.

Every command calls the same services as the web and the API. Bad input exits non-zero
with one line on stderr and changes nothing.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

EXIT_REFUSED = 1
EXIT_USAGE = 2
WAIT_STATUSES = ("suspended", "completed", "failed", "cancelled")


class CliError(Exception):
    """A problem to report in one line, exiting non-zero."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "handler", None) is not _worker:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.celery_args = extra
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_USAGE
    try:
        _setup_django()
        from django.db import DatabaseError

        from agents.services import ServiceError

        try:
            return args.handler(args) or 0
        except ServiceError as exc:
            raise CliError(exc.message) from None
        except DatabaseError as exc:
            raise CliError(f"database error: {exc} (is it migrated? `make run` migrates it)") from None
    except CliError as exc:
        print(f"agentfast: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return 130


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    import django

    from agents.policy import ConfigError

    try:
        django.setup()
    except ConfigError as exc:
        raise CliError(str(exc)) from None


# -- parser ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentfast", description="Durable human approval for AI agents.")
    groups = parser.add_subparsers(title="commands", metavar="COMMAND")
    _approvals_parser(groups.add_parser("approvals", help="list, show, approve and reject approvals"))
    _runs_parser(groups.add_parser("runs", help="start, list, show and resume runs"))
    effects = groups.add_parser("effects", help="the demo tools' side-effect journal").add_subparsers(metavar="ACTION")
    _command(effects, "list", _effects_list, "list side effects", json_flag=True)
    users = groups.add_parser("users", help="reviewers and admins").add_subparsers(metavar="ACTION")
    create = _command(users, "create", _users_create, "create a reviewer or an admin")
    create.add_argument("name")
    create.add_argument("--role", required=True, choices=["reviewer", "admin"])
    create.add_argument("--password", help="default: a generated one, printed once")
    create.add_argument("--email", default="")
    tokens = groups.add_parser("tokens", help="bearer tokens for the HTTP API").add_subparsers(metavar="ACTION")
    token_create = _command(tokens, "create", _tokens_create, "create a token for a user; it is printed once")
    token_create.add_argument("user")
    token_create.add_argument("--name", default="")
    token_revoke = _command(tokens, "revoke", _tokens_revoke, "revoke a token (by its prefix or the whole token)")
    token_revoke.add_argument("token")
    _command(groups, "dev", _dev, "start Redis, web, worker and beat on this machine (make run)")
    serve = _command(groups, "serve", _serve, "serve the web app and API with daphne")
    serve.add_argument("--host", default=os.environ.get("AGENTFAST_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("AGENTFAST_PORT", "8321")))
    _command(groups, "worker", _worker, "run a Celery worker (extra arguments go to celery worker)")
    return parser


def _command(
    parent: Any, name: str, handler: Callable[[argparse.Namespace], int | None], help: str, *, json_flag: bool = False
) -> argparse.ArgumentParser:
    parser = parent.add_parser(name, help=help, description=help)
    parser.set_defaults(handler=handler)
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _approvals_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(metavar="ACTION")
    listing = _command(actions, "list", _approvals_list, "list approvals (pending by default)", json_flag=True)
    listing.add_argument("--status", default="pending", choices=["pending", "approved", "rejected", "expired", "all"])
    listing.add_argument("--agent")
    listing.add_argument("--tool")
    listing.add_argument("--limit", type=int, default=100)
    show = _command(actions, "show", _approvals_show, "show one approval", json_flag=True)
    show.add_argument("id")
    approve = _command(
        actions, "approve", _approvals_approve, "approve a call (optionally with edited arguments)", json_flag=True
    )
    approve.add_argument("id")
    approve.add_argument("--by", required=True, help="who decides")
    approve.add_argument("--note", default="")
    approve.add_argument("--args", dest="arguments", help="edited arguments, a JSON object")
    approve.add_argument("--payload", help="a JSON object for a tool that asked a question")
    approve.add_argument("--answer", help="shorthand for --payload '{\"answer\": TEXT}'")
    approve.add_argument("--no-resume", action="store_true", help="leave the resume to the caller")
    reject = _command(actions, "reject", _approvals_reject, "reject a call; the model reads the note", json_flag=True)
    reject.add_argument("id")
    reject.add_argument("--by", required=True, help="who decides")
    reject.add_argument("--note", default="")
    reject.add_argument("--feedback", default="", help="a message for the model to revise its call with")
    reject.add_argument("--no-resume", action="store_true", help="leave the resume to the caller")


def _runs_parser(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(metavar="ACTION")
    start = _command(actions, "start", _runs_start, "start a run of an agent", json_flag=True)
    start.add_argument("--agent", required=True)
    start.add_argument("prompt")
    start.add_argument("--wait", action="store_true", help="wait until the run is suspended or finished")
    start.add_argument("--timeout", type=float, default=60, help="seconds --wait waits (default 60)")
    start.add_argument("--inline", action="store_true", help="drive the run in this process, without a worker")
    start.add_argument("--no-auto-resume", action="store_true", help="decisions do not resume the run by themselves")
    start.add_argument("--by", default="", help="who starts the run (default: your login)")
    listing = _command(actions, "list", _runs_list, "list runs", json_flag=True)
    listing.add_argument("--status")
    listing.add_argument("--agent")
    listing.add_argument("--limit", type=int, default=50)
    show = _command(actions, "show", _runs_show, "show a run: messages, tool calls, approvals", json_flag=True)
    show.add_argument("id")
    resume = _command(actions, "resume", _runs_resume, "resume a run whose approvals are decided", json_flag=True)
    resume.add_argument("id")
    resume.add_argument("--inline", action="store_true", help="drive the run in this process")
    cancel = _command(actions, "cancel", _runs_cancel, "cancel a run; its pending approvals expire", json_flag=True)
    cancel.add_argument("id")
    cancel.add_argument("--by", required=True)


# -- approvals ---------------------------------------------------------------------------


def _approvals_list(args: argparse.Namespace) -> None:
    from agents import selectors, serializers

    approvals = selectors.approval_list(status=args.status, agent=args.agent, tool=args.tool)[: args.limit]
    rows = [serializers.approval_summary(a) for a in approvals]
    if args.json:
        return _print_json(rows)
    if not rows:
        print(f"No {'' if args.status == 'all' else args.status + ' '}approvals.")
        return None
    table = [
        [r["id"], r["tool"], _compact(r["arguments"], 48), r["mode"], r["status"], _ago(r["created_at"])] for r in rows
    ]
    _print_table(["ID", "TOOL", "ARGUMENTS", "MODE", "STATUS", "WAITING"], table)
    return None


def _approvals_show(args: argparse.Namespace) -> None:
    from agents import selectors, serializers

    detail = serializers.approval_detail(selectors.approval_get(args.id))
    if args.json:
        return _print_json(detail)
    for key in (
        "id",
        "run_id",
        "agent",
        "tool",
        "mode",
        "status",
        "created_at",
        "decided_by",
        "decided_at",
        "note",
        "feedback",
    ):
        if detail[key] not in (None, ""):
            print(f"{key + ':':12} {detail[key]}")
    print("arguments:\n" + _indent(json.dumps(detail["arguments"], indent=2, ensure_ascii=False)))
    for key in ("edited_arguments", "request", "payload"):
        if detail[key] is not None:
            print(f"{key}:\n" + _indent(json.dumps(detail[key], indent=2, ensure_ascii=False)))
    return None


def _approvals_approve(args: argparse.Namespace) -> None:
    arguments = _json_object(args.arguments, "--args")
    payload = _json_object(args.payload, "--payload")
    if args.answer is not None:
        payload = {**(payload or {}), "answer": args.answer}
    _decide(args, "approved", arguments=arguments, payload=payload)


def _approvals_reject(args: argparse.Namespace) -> None:
    _decide(args, "rejected", feedback=args.feedback)


def _decide(args: argparse.Namespace, decision: str, **fields: Any) -> None:
    from agents import queue, serializers, services

    attempt = services.Attempt(actor=args.by, source="cli", origin=f"{getpass.getuser()}@{socket.gethostname()}")
    result = services.approval_decide(
        approval_id=args.id,
        decision=decision,
        attempt=attempt,
        note=args.note,
        auto_resume=False if args.no_resume else None,
        **fields,
    )
    if args.json:
        return _print_json(
            {
                **serializers.approval_detail(result.approval),
                "outcome": result.outcome,
                "resume_enqueued": result.resume_enqueued,
            }
        )
    approval = result.approval
    if result.outcome == "idempotent":
        print(f"{approval.id} was already {approval.status} by {approval.decided_by}; nothing changed.")
        return None
    print(f"{decision.capitalize()} {approval.id} ({approval.tool}) as {approval.decided_by}.")
    if result.resume_enqueued or approval.mode == "defer":
        reachable, url = queue.broker_reachable()
        if not reachable:
            print(
                f"warning: the broker is unreachable ({url}); the decision is saved and the sweeper will act on it once the broker is back.",
                file=sys.stderr,
            )
        else:
            print("The run resumes in a worker." if result.resume_enqueued else "The deferred call runs in a worker.")
    elif approval.mode == "suspend" and not args.no_resume:
        print("The run resumes once its other pending approvals are decided.")
    return None


# -- runs --------------------------------------------------------------------------------


def _runs_start(args: argparse.Namespace) -> None:
    from agents import runtime, selectors, services

    if not args.inline:
        _require_broker()
    run = services.run_create(
        agent=args.agent,
        input=args.prompt,
        created_by=args.by or getpass.getuser(),
        auto_resume=not args.no_auto_resume,
        enqueue=not args.inline,
    )
    if args.inline:
        runtime.drive(run.id)
    elif args.wait:
        _wait(run.id, args.timeout)
    run = selectors.run_get(run.id)
    if args.json:
        return _print_json({"id": run.id, "status": run.status})
    print(f"{run.id} {run.status}")
    _print_outcome(run)
    return None


def _require_broker() -> None:
    from agents import queue

    reachable, url = queue.broker_reachable()
    if not reachable:
        raise CliError(
            f"cannot reach the broker at {url}: start it with `make run`, or pass --inline to drive the run in this process"
        )


def _wait(run_id: str, timeout: float) -> None:
    from agents.models import Run

    deadline = time.monotonic() + timeout
    while Run.objects.filter(pk=run_id).values_list("status", flat=True).get() not in WAIT_STATUSES:
        if time.monotonic() > deadline:
            raise CliError(
                f"{run_id} did not pause or finish within {timeout:g}s; is a worker running? (see `agentfast runs show {run_id}`)"
            )
        time.sleep(0.05)


def _print_outcome(run: Any) -> None:
    if run.status == "suspended":
        for approval in run.approvals.filter(status="pending", mode="suspend"):
            print(f"waiting on {approval.id} ({approval.tool} {_compact(approval.tool_call.arguments, 60)})")
        print("decide with: agentfast approvals approve|reject <id> --by <you>")
    elif run.status == "completed":
        print(run.output)
    elif run.status == "failed":
        print(f"error: {run.error}")


def _runs_list(args: argparse.Namespace) -> None:
    from agents import selectors, serializers

    rows = [serializers.run_summary(r) for r in selectors.run_list(status=args.status, agent=args.agent)[: args.limit]]
    if args.json:
        return _print_json(rows)
    if not rows:
        print('No runs. Start one with: agentfast runs start --agent support "Refund order A1001 for 25.00 USD"')
        return None
    _print_table(
        ["ID", "AGENT", "STATUS", "STARTED", "INPUT"],
        [[r["id"], r["agent"], r["status"], _ago(r["created_at"]), _cut(r["input"], 50)] for r in rows],
    )
    return None


def _runs_show(args: argparse.Namespace) -> None:
    from agents import selectors, serializers

    detail = serializers.run_detail(selectors.run_get(args.id))
    if args.json:
        return _print_json(detail)
    print(f"{detail['id']}  agent={detail['agent']}  status={detail['status']}")
    if detail["error"]:
        print(f"error: {detail['error']}")
    print("\nconversation:")
    for message in detail["messages"]:
        text = message["content"] or ""
        if message["tool_calls"]:
            calls = ", ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in message["tool_calls"])
            text = (text + " " if text else "") + f"→ {calls}"
        print(f"  {message['seq']:>3} {message['role']:<9} {_cut(text, 110)}")
    if detail["tool_calls"]:
        print("\ntool calls:")
        rows = [
            [
                c["call_id"],
                c["name"],
                c["status"] + (" (IN DOUBT)" if c["in_doubt"] else ""),
                _compact(c["executed_arguments"] or c["arguments"], 50),
            ]
            for c in detail["tool_calls"]
        ]
        _print_table(["CALL", "TOOL", "STATUS", "ARGUMENTS"], rows, indent="  ")
    if detail["approvals"]:
        print("\napprovals:")
        _print_table(
            ["ID", "MODE", "STATUS", "BY", "NOTE"],
            [
                [a["id"], a["mode"], a["status"], a["decided_by"] or "", _cut(a["note"], 40)]
                for a in detail["approvals"]
            ],
            indent="  ",
        )
    return None


def _runs_resume(args: argparse.Namespace) -> None:
    from agents import runtime, selectors, services

    if not args.inline:
        _require_broker()
    run = services.run_request_resume(run_id=args.id, enqueue=not args.inline)
    if args.inline:
        runtime.drive(run.id)
        run = selectors.run_get(run.id)
    if args.json:
        return _print_json({"id": run.id, "status": run.status})
    print(f"{run.id} {run.status}" + ("" if args.inline else " (resume enqueued)"))
    if args.inline:
        _print_outcome(run)
    return None


def _runs_cancel(args: argparse.Namespace) -> None:
    from agents import services

    attempt = services.Attempt(actor=args.by, source="cli", origin=f"{getpass.getuser()}@{socket.gethostname()}")
    run = services.run_cancel(run_id=args.id, attempt=attempt)
    if args.json:
        return _print_json({"id": run.id, "status": run.status})
    print(f"{run.id} cancelled")
    return None


# -- effects, users ----------------------------------------------------------------------


def _effects_list(args: argparse.Namespace) -> None:
    from agents import selectors, serializers

    rows = [serializers.side_effect(e) for e in selectors.sideeffect_list()]
    if args.json:
        return _print_json(rows)
    if not rows:
        print("No side effects yet.")
        return None
    _print_table(
        ["TOOL", "IDEMPOTENCY KEY", "ARGUMENTS", "AT"],
        [[r["tool"], r["idempotency_key"], _compact(r["arguments"], 60), r["created_at"]] for r in rows],
    )
    return None


def _users_create(args: argparse.Namespace) -> None:
    from agents import services

    user, password = services.user_create(username=args.name, role=args.role, password=args.password, email=args.email)
    print(f"created {args.role} {user.username}" + ("" if args.password else f" with password {password}"))


def _tokens_create(args: argparse.Namespace) -> None:
    from agents import services

    _, token = services.token_create(username=args.user, name=args.name)
    print(token)


def _tokens_revoke(args: argparse.Namespace) -> None:
    from agents import services

    token = services.token_revoke(prefix=args.token)
    print(f"revoked {token.prefix} of {token.user.username}")


# -- processes ---------------------------------------------------------------------------


def _dev(args: argparse.Namespace) -> None:
    """Start the embedded Redis, migrate, make a login, then run the Procfile with honcho."""
    from django.conf import settings
    from django.core.management import call_command

    from agents import embedded_redis

    settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
    if settings.REDIS_IS_EMBEDDED:
        sock = embedded_redis.socket_path(settings.VAR_DIR)
        embedded_redis.start(sock, workdir=settings.VAR_DIR)
        print(f"redis: embedded, on {sock}")
    call_command("migrate", interactive=False, verbosity=0)
    username, password = _dev_login(settings.VAR_DIR / "login.txt")
    port = os.environ.get("AGENTFAST_PORT", "8321")
    print(f"\n  agentfast is starting on http://localhost:{port}/\n  login: {username} / {password}\n")
    os.chdir(settings.BASE_DIR)
    os.execvp(sys.executable, [sys.executable, "-m", "honcho", "start", "-f", "Procfile"])


def _dev_login(path: Path) -> tuple[str, str]:
    """Return the demo admin's login, creating the user (or a new password) when needed."""
    from django.contrib.auth.models import User

    from agents import services

    if path.exists():
        username, _, password = path.read_text().strip().partition(" ")
        user = User.objects.filter(username=username).first()
        if user is not None and user.check_password(password):
            return username, password
    User.objects.filter(username="admin").delete()
    user, password = services.user_create(username="admin", role="admin")
    path.write_text(f"{user.username} {password}\n")
    path.chmod(0o600)
    return user.username, password


def _serve(args: argparse.Namespace) -> None:
    os.execvp(
        sys.executable,
        [sys.executable, "-m", "daphne", "-b", args.host, "-p", str(args.port), "dashboard.asgi:application"],
    )


def _worker(args: argparse.Namespace) -> None:
    os.execvp(
        sys.executable,
        [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "--loglevel=INFO", *args.celery_args],
    )


# -- output helpers ----------------------------------------------------------------------


def _json_object(text: str | None, flag: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CliError(f"{flag} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CliError(f"{flag} must be a JSON object, like '{{\"amount_cents\": 1000}}'")
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _print_table(headers: list[str], rows: list[list[Any]], indent: str = "") -> None:
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print(indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _compact(value: Any, limit: int) -> str:
    return _cut(json.dumps(value, ensure_ascii=False, separators=(",", ":")) if value is not None else "", limit)


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _ago(iso: str | None) -> str:
    from django.utils import timezone
    from django.utils.dateparse import parse_datetime

    when = parse_datetime(iso) if iso else None
    if when is None:
        return ""
    seconds = int((timezone.now() - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{max(seconds, 0)}s ago"


if __name__ == "__main__":
    sys.exit(main())
