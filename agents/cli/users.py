"""`agentfast users`: create reviewers and admins, set a password."""

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
    password = command(actions, "password", _password, "set a user's password (asked for unless --password)")
    password.add_argument("name")
    password.add_argument("--password", help="default: ask for it twice, without echo")


def _create(args: argparse.Namespace) -> None:
    from agents import services

    user, password = services.user_create(username=args.name, role=args.role, password=args.password, email=args.email)
    echo(f"created {args.role} {user.username}" + ("" if args.password else f" with password {password}"))


def _password(args: argparse.Namespace) -> None:
    from agents import services

    password = args.password if args.password is not None else _ask_password()
    user = services.user_set_password(username=args.name, password=password)
    echo(f"password set for {user.username}")


def _ask_password() -> str:
    from agents import text

    first = getpass.getpass("New password: ")
    if getpass.getpass("Again: ") != first:
        raise CliError("the passwords differ; nothing changed")
    try:
        return text.require_clean(first, field="password")
    except text.UnsafeText as exc:
        raise CliError(exc.message) from None
