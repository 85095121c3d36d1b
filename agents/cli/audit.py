"""`agentfast audit`: check that the audit log was not altered."""

from __future__ import annotations

import argparse
from typing import Any

from agents.cli.output import EXIT_REFUSED, command, echo, print_json


def register(groups: Any) -> None:
    """Add the `audit` group."""
    actions = groups.add_parser("audit", help="the audit log's hash chain").add_subparsers(metavar="ACTION")
    command(
        actions,
        "verify",
        _verify,
        "recompute the audit chain; name the first entry altered, removed or reordered (exit 1)",
        json_flag=True,
    )


def _verify(args: argparse.Namespace) -> int:
    from agents import services

    report = services.audit_verify()
    if args.json:
        print_json(_as_json(report))
    elif report.ok:
        echo(f"ok: {report.entries} entries, head {report.head}")
    else:
        echo(f"broken after {report.entries} intact entries: {report.message}")
    return 0 if report.ok else EXIT_REFUSED


def _as_json(report: Any) -> dict[str, Any]:
    value: dict[str, Any] = {"ok": report.ok, "entries": report.entries, "head": report.head}
    if not report.ok:
        value["problem"] = report.problem
        created_at = report.entry_created_at
        value["entry"] = {"id": report.entry_id, "created_at": created_at.isoformat() if created_at else None}
        value["message"] = report.message
    return value
