"""`agentfast approvals`: list, show, approve and reject."""

from __future__ import annotations

import argparse
from typing import Any

from agents.cli.output import (
    ago,
    attempt,
    command,
    compact,
    count,
    echo,
    indent,
    json_object,
    print_json,
    print_table,
)

APPROVAL_STATUSES = ("pending", "approved", "rejected", "expired", "all")
_EXPECT_HELP = "the arguments digest you reviewed (`approvals show`); refused if the arguments changed since"
_REMEMBER_HELP = "also decide this agent's matching calls for this long (30m, 1h, 8h, 24h, up to 7d): a standing grant"
_BY_HELP = "who decides; when the call names approvers or four eyes, an existing user allowed to decide it"


def register(groups: Any) -> None:
    """Add the `approvals` group."""
    parser = groups.add_parser("approvals", help="list, show, approve and reject approvals")
    actions = parser.add_subparsers(metavar="ACTION")
    listing = command(actions, "list", _list, "list approvals (pending by default)", json_flag=True)
    listing.add_argument("--status", default="pending", choices=APPROVAL_STATUSES)
    listing.add_argument("--agent")
    listing.add_argument("--tool")
    listing.add_argument("--limit", type=count, default=100)
    show = command(actions, "show", _show, "show one approval", json_flag=True)
    show.add_argument("id")
    approve = command(actions, "approve", _approve, "approve a call (optionally with edited arguments)", json_flag=True)
    approve.add_argument("id")
    approve.add_argument("--by", required=True, help=_BY_HELP)
    approve.add_argument("--note", default="")
    approve.add_argument("--args", dest="arguments", help="edited arguments, a JSON object")
    approve.add_argument("--payload", help="a JSON object for a tool that asked a question")
    approve.add_argument("--answer", help="shorthand for --payload '{\"answer\": TEXT}'")
    approve.add_argument("--no-resume", action="store_true", help="leave the resume to the caller")
    approve.add_argument("--expect-digest", default="", help=_EXPECT_HELP)
    _remember_flags(approve)
    reject = command(actions, "reject", _reject, "reject a call; the model reads the note", json_flag=True)
    reject.add_argument("id")
    reject.add_argument("--by", required=True, help=_BY_HELP)
    reject.add_argument("--note", default="")
    reject.add_argument("--feedback", default="", help="a message for the model to revise its call with")
    reject.add_argument("--no-resume", action="store_true", help="leave the resume to the caller")
    reject.add_argument("--expect-digest", default="", help=_EXPECT_HELP)
    _remember_flags(reject)
    extend = command(actions, "extend", _extend, "push a pending approval's deadline later", json_flag=True)
    extend.add_argument("id")
    extend.add_argument("--by", required=True, help="who extends it: someone who may decide it")
    extend.add_argument("--for", dest="duration", required=True, help="how much later: 90s, 30m, 4h, 2d")


def _remember_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remember", metavar="DURATION", help=_REMEMBER_HELP)
    parser.add_argument(
        "--remember-scope",
        choices=("exact", "tool"),
        default="exact",
        help="exact: these arguments only (default); tool: any arguments of this tool from this agent",
    )


def _list(args: argparse.Namespace) -> None:
    from agents import schemas, selectors

    approvals = selectors.approval_list(status=args.status, agent=args.agent, tool=args.tool)[: args.limit]
    rows = [schemas.ApprovalSummary.of(a).as_json() for a in approvals]
    if args.json:
        return print_json(rows)
    if not rows:
        echo(f"No {'' if args.status == 'all' else args.status + ' '}approvals.")
        return None
    table = [
        [r["id"], r["tool"], compact(r["arguments"], 48), r["mode"], r["status"], ago(r["created_at"])] for r in rows
    ]
    print_table(["ID", "TOOL", "ARGUMENTS", "MODE", "STATUS", "WAITING"], table)
    return None


def _show(args: argparse.Namespace) -> None:
    from agents import schemas, selectors, text

    approval = selectors.approval_get(args.id)
    detail = schemas.ApprovalDetail.of(approval).as_json()
    if args.json:
        return print_json(detail)
    fields = ("id", "run_id", "agent", "tool", "mode", "status", "created_at", "decided_by", "decided_at", "note")
    for key in (*fields, "feedback"):
        if detail[key] not in (None, ""):
            echo(f"{key + ':':12} {detail[key]}")
    echo(
        f"{'approvers:':12} {', '.join(detail['approvers']) or 'any reviewer'}" + (" (four eyes)" * detail["four_eyes"])
    )
    echo(f"{'votes:':12} {detail['tally']}")
    for voter, answer in approval.answers_so_far:  # what the approvers before this one answered a question
        echo(f"{'answered:':12} {voter}: {answer}")
    for voter, note in approval.notes_so_far:  # and why they approved
        echo(f"{'noted:':12} {voter}: {note}")
    echo(f"{'digest:':12} {detail['arguments_digest'][:12]}")
    echo("arguments:\n" + indent(text.dumps(detail["arguments"], indent=2)))
    for key in ("edited_arguments", "request", "payload"):
        if detail[key] is not None:
            echo(f"{key}:\n" + indent(text.dumps(detail[key], indent=2)))
    return None


def _approve(args: argparse.Namespace) -> None:
    arguments = json_object(args.arguments, "--args")
    payload = json_object(args.payload, "--payload")
    if args.answer is not None:
        payload = {**(payload or {}), "answer": args.answer}
    _decide(args, "approved", arguments=arguments, payload=payload)


def _reject(args: argparse.Namespace) -> None:
    _decide(args, "rejected", feedback=args.feedback)


def _decide(args: argparse.Namespace, decision: str, **fields: Any) -> None:
    from agents import queue, schemas, selectors, services

    who = attempt(args.by)
    result = services.approval_decide(
        approval_id=args.id,
        decision=decision,
        attempt=who,
        note=args.note,
        auto_resume=False if args.no_resume else None,
        expect_digest=args.expect_digest,
        remember=_remember(args),
        **fields,
    )
    approval = selectors.approval_get(result.approval.id)
    if args.json:
        grant_id = result.grant.id if result.grant else ""
        shape = schemas.Decision.of_decision(
            approval, outcome=result.outcome, resume_enqueued=result.resume_enqueued, grant_id=grant_id
        )
        return print_json(shape.as_json())
    if result.outcome == "voted":
        echo(
            f"Approved {approval.id} ({approval.tool}) as {who.decider}: {approval.tally};"
            f" it runs at {approval.quorum}."
        )
        return None
    if result.outcome == "idempotent" and approval.status == "pending":
        echo(f"{who.decider} already approved these arguments of {approval.id}; nothing changed ({approval.tally}).")
        return None
    if result.outcome == "idempotent":
        echo(f"{approval.id} was already {approval.status} by {approval.decided_by}; nothing changed.")
        return None
    echo(f"{decision.capitalize()} {approval.id} ({approval.tool}) as {approval.decided_by}.")
    if result.grant is not None:
        what = "these exact arguments" if result.grant.scope == "exact" else f"any {approval.tool} call of this agent"
        echo(f"Remembered as grant {result.grant.id} for {what}, until {result.grant.expires_at:%Y-%m-%d %H:%M} UTC.")
    if result.resume_enqueued or approval.mode == "defer":
        reachable, url = queue.broker_reachable()
        if not reachable:
            echo(
                f"warning: the broker is unreachable ({url}); the decision is saved and the sweeper will act on it "
                "once the broker is back.",
                err=True,
            )
        else:
            echo("The run resumes in a worker." if result.resume_enqueued else "The deferred call runs in a worker.")
    elif approval.mode == "suspend" and not args.no_resume:
        echo("The run resumes once its other pending approvals are decided.")
    return None


def _remember(args: argparse.Namespace) -> Any:
    """Return the validated --remember request, or None."""
    from agents import services

    if args.remember is None:
        return None
    return services.Remember.of(args.remember_scope, services.parse_duration(args.remember))


def _extend(args: argparse.Namespace) -> None:
    from agents import schemas, selectors, services
    from agents.policy.config import parse_duration

    try:
        seconds = parse_duration(args.duration)
    except (ValueError, TypeError) as exc:
        raise services.InvalidInput(f"--for {exc}", field="for") from None
    approval = services.approval_extend(approval_id=args.id, by_seconds=seconds, attempt=attempt(args.by))
    if args.json:
        return print_json(schemas.ApprovalDetail.of(selectors.approval_get(approval.id)).as_json())
    echo(
        f"Extended {approval.id} ({approval.tool}) as {args.by}:"
        f" it waits until {approval.expires_at:%Y-%m-%d %H:%M:%S} UTC."
    )
    return None
