"""`agentfast grants`: list and revoke standing decisions (remembered approvals and rejections)."""

from __future__ import annotations

import argparse
from typing import Any

from agents.cli.output import ago, command, echo, person, print_json, print_table


def register(groups: Any) -> None:
    """Add the `grants` group."""
    parser = groups.add_parser("grants", help="list and revoke standing decisions (remembered approvals)")
    actions = parser.add_subparsers(metavar="ACTION")
    listing = command(actions, "list", _list, "list standing decisions (live ones by default)", json_flag=True)
    listing.add_argument("--all", action="store_true", help="include expired and revoked ones")
    revoke = command(actions, "revoke", _revoke, "revoke a standing decision (its creator's, or any for an admin)")
    revoke.add_argument("id")
    revoke.add_argument("--by", required=True, help="who revokes: the grant's creator, or an admin")


def _list(args: argparse.Namespace) -> None:
    from agents import selectors

    rows = [selectors.grant_as_json(g) for g in selectors.grant_list(include_ended=args.all)]
    if args.json:
        return print_json(rows)
    if not rows:
        echo("No standing decisions.")
        return None
    table = [
        [
            r["id"],
            r["decision"],
            r["scope"],
            r["tool"],
            r["agent"] if r["kind"] != "external" else f"{r['agent']} (account {r['account'] or '?'})",
            r["created_by"],
            r["state"] if r["state"] != "live" else f"until {r['expires_at'][:16]}Z",
            r["uses"],
            ago(r["last_used_at"]) if r["last_used_at"] else "-",
        ]
        for r in rows
    ]
    print_table(["ID", "DECISION", "SCOPE", "TOOL", "AGENT", "BY", "EXPIRES", "USES", "LAST USED"], table)
    return None


def _revoke(args: argparse.Namespace) -> None:
    from agents import services

    grant = services.grant_revoke(grant_id=args.id, actor=person(args.by), source="cli")
    echo(f"Revoked {grant.id} ({grant.decision} {grant.tool} for {grant.principal}) as {grant.revoked_by}.")
