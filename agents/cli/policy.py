"""`agentfast policy`: what agentfast.yaml would do with a call, without running anything."""

from __future__ import annotations

import argparse
from typing import Any

from agents.cli.output import CliError, command, echo, json_object, print_json


def register(groups: Any) -> None:
    """Add the `policy` group."""
    actions = groups.add_parser("policy", help="try the approval policy").add_subparsers(metavar="ACTION")
    check = command(
        actions, "check", _check, "print what would happen to a call (outcome, rule, approvers)", json_flag=True
    )
    check.add_argument("tool")
    check.add_argument("arguments", metavar="ARGS_JSON", help="the call's arguments, a JSON object")
    check.add_argument("--agent", required=True)
    check.add_argument("--by", default="", help="also say whether this user could approve it")
    check.add_argument(
        "--account",
        default="",
        help="check it as an external agent's call, gated by this agent account (rules may read `account`)",
    )


def _check(args: argparse.Namespace) -> None:
    from agents.policy.rules import CheckError, check, describe

    arguments = json_object(args.arguments, "ARGS_JSON") or {}
    try:
        verdict = check(args.tool, arguments, agent_name=args.agent, by=args.by, account=args.account)
    except CheckError as exc:
        raise CliError(f"{exc}; nothing was run") from None
    could = _could_approve(args.by, verdict) if args.by else None
    if args.json:
        print_json({**verdict.as_dict(), **({"by": args.by, "could_approve": could} if args.by else {})})
        return
    echo(f"outcome:   {verdict.action}")
    echo(f"rule:      {verdict.rule or verdict.decided_by or '(none: the tool’s own settings)'}")
    echo(f"means:     {describe(verdict)}")
    if verdict.action == "ask":
        echo(f"approvers: {', '.join(verdict.approvers) or 'any reviewer'}")
        echo(f"quorum:    {verdict.quorum}")
        echo(f"four eyes: {'yes: whoever started the run may not approve' if verdict.four_eyes else 'no'}")
    if verdict.reason:
        echo(f"reason:    {verdict.reason}")
    echo(f"policy:    {verdict.policy_version}")
    if args.by:
        # The call is checked as one of a run `--by` started, so four eyes keeps them from approving it.
        why = " (four eyes: they started the run)" if verdict.action == "ask" and verdict.four_eyes else ""
        echo(f"by:        {args.by} {'could approve it' if could else 'could not approve it'}{why}")


def _could_approve(username: str, verdict: Any) -> bool:
    """Return whether a user could approve the call of a run they started: a reviewer, one of its approvers if
    it names any, and not kept out by four eyes."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise CliError(f"no active user {username!r}; nothing was run")
    if verdict.action != "ask" or verdict.four_eyes or not user.has_perm("agents.decide_approval"):
        return False
    if not verdict.approvers:
        return True
    groups = set(user.groups.values_list("name", flat=True))
    return any(a == f"user:{username}" or a in groups for a in verdict.approvers)
