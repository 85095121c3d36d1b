"""`agentfast effects`: the demo tools' side-effect journal."""

from __future__ import annotations

import argparse
from typing import Any

from agents.cli.output import command, compact, echo, print_json, print_table


def register(groups: Any) -> None:
    """Add the `effects` group."""
    actions = groups.add_parser("effects", help="the demo tools' side-effect journal").add_subparsers(metavar="ACTION")
    command(actions, "list", _list, "list side effects", json_flag=True)


def _list(args: argparse.Namespace) -> None:
    from agents import schemas, selectors

    rows = [schemas.SideEffectShape.of(e).as_json() for e in selectors.sideeffect_list()]
    if args.json:
        return print_json(rows)
    if not rows:
        echo("No side effects yet.")
        return None
    print_table(
        ["TOOL", "IDEMPOTENCY KEY", "ARGUMENTS", "AT"],
        [[r["tool"], r["idempotency_key"], compact(r["arguments"], 60), r["created_at"]] for r in rows],
    )
    return None
