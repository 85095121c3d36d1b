"""`agentfast tokens`: bearer tokens for the HTTP API."""

from __future__ import annotations

import argparse
from typing import Any

from agents.cli.output import command, echo


def register(groups: Any) -> None:
    """Add the `tokens` group."""
    actions = groups.add_parser("tokens", help="bearer tokens for the HTTP API").add_subparsers(metavar="ACTION")
    create = command(actions, "create", _create, "create a token for a user; it is printed once")
    create.add_argument("user")
    create.add_argument("--name", default="")
    revoke = command(actions, "revoke", _revoke, "revoke a token (by its prefix or the whole token)")
    revoke.add_argument("token")


def _create(args: argparse.Namespace) -> None:
    from agents import services

    _, token = services.token_create(username=args.user, name=args.name)
    echo(token)


def _revoke(args: argparse.Namespace) -> None:
    from agents import services

    token = services.token_revoke(prefix=args.token)
    echo(f"revoked {token.prefix} of {token.user.username}")
