"""`agentfast users`: create reviewers and admins, set their approver groups and password."""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from agents.cli.output import CliError, command, echo


def register(groups: Any) -> None:
    """Add the `users` group."""
    actions = groups.add_parser("users", help="reviewers and admins").add_subparsers(metavar="ACTION")
    create = command(actions, "create", _create, "create a reviewer, an admin or an agent (gates its calls)")
    create.add_argument("name")
    create.add_argument("--role", required=True, choices=["reviewer", "admin", "agent"])
    create.add_argument("--password", help="default: a generated one, printed once")
    create.add_argument("--email", default="")
    create.add_argument(
        "--group", action="append", default=[], dest="groups", help="an approver group (repeatable), as in approvers:"
    )
    groups = command(actions, "groups", _groups, "set a user's approver groups (their role stays)")
    groups.add_argument("name")
    groups.add_argument("groups", nargs="*", metavar="GROUP", help="none: the user leaves every approver group")
    password = command(actions, "password", _password, "set a user's password (asked for unless --password)")
    password.add_argument("name")
    password.add_argument("--password", help="default: ask for it twice, without echo")
    link = command(
        actions, "link-slack", _link_slack, "say which Slack user (U012AB3CD) a reviewer is, for chat buttons"
    )
    link.add_argument("name")
    link.add_argument("slack_id")


def _create(args: argparse.Namespace) -> None:
    from agents import services

    user, password = services.user_create(
        username=args.name, role=args.role, password=args.password, email=args.email, groups=tuple(args.groups)
    )
    in_groups = f" in {', '.join(args.groups)}" if args.groups else ""
    echo(f"created {args.role} {user.username}{in_groups}" + ("" if args.password else f" with password {password}"))


def _groups(args: argparse.Namespace) -> None:
    from agents import services

    user = services.user_set_groups(username=args.name, groups=tuple(args.groups))
    names = sorted(user.groups.exclude(name__in=services.users.ROLES).values_list("name", flat=True))
    echo(f"{user.username} is in {', '.join(names)}" if names else f"{user.username} is in no approver group")


def _password(args: argparse.Namespace) -> None:
    from agents import services

    password = args.password if args.password is not None else _ask_password()
    user = services.user_set_password(username=args.name, password=password)
    echo(f"password set for {user.username}")


def _link_slack(args: argparse.Namespace) -> None:
    from agents.services import notify

    link = notify.slacklink_set(username=args.name, slack_id=args.slack_id)
    echo(f"Slack user {link.slack_id} is now {link.user.username}")


def _ask_password() -> str:
    from agents import text

    first = getpass.getpass("New password: ")
    if getpass.getpass("Again: ") != first:
        raise CliError("the passwords differ; nothing changed")
    try:
        return text.require_clean(first, field="password")
    except text.UnsafeText as exc:
        raise CliError(exc.message) from None
