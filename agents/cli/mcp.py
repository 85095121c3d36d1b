"""`agentfast mcp-proxy`: an MCP server in front of another, asking agentfast before each tool call."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from agents.cli.output import CliError, command, seconds


def register(groups: Any) -> None:
    """Add the `mcp-proxy` command."""
    proxy = command(
        groups,
        "mcp-proxy",
        _proxy,
        "serve an MCP server's tools to an MCP client, each call through the policy (stdio, or HTTP with --listen)",
    )
    upstream = proxy.add_mutually_exclusive_group(required=True)
    upstream.add_argument("--upstream", metavar="COMMAND", help="the MCP server to start (stdio), e.g. 'npx server'")
    upstream.add_argument("--upstream-url", metavar="URL", help="the MCP server to reach (streamable HTTP)")
    proxy.add_argument("--name", default="", help="the server's name in agentfast.yaml's mcp: (default: its own)")
    proxy.add_argument("--account", default="mcp", help="the agent account calls are recorded under (default: mcp)")
    proxy.add_argument(
        "--session", default="mcp", help="the session (one run in the inbox; identical calls in it are one call)"
    )
    proxy.add_argument("--wait", type=seconds, default=50.0, help="seconds a call waits for a reviewer (default: 50)")
    proxy.add_argument(
        "--listen", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio"
    )


def _proxy(args: argparse.Namespace) -> None:
    from agents.gateway import mcp
    from agents.gateway.selectors import account_may_gate

    if not account_may_gate(args.account):
        raise CliError(
            f"--account {args.account}: no active agent account (agentfast users create {args.account} --role agent)"
        )
    _require_session(args.session)
    if args.listen is not None and not _is_host_and_port(args.listen):
        raise CliError("--listen must be HOST:PORT with a port from 1 to 65535, like 127.0.0.1:8765")
    options = mcp.Options(owner=args.account, session=args.session, server=args.name, wait_seconds=args.wait)
    logging.getLogger("mcp").setLevel(logging.WARNING)  # stderr is the client's log: one line per request is noise
    try:
        asyncio.run(mcp.serve(options, command=args.upstream, url=args.upstream_url, listen=args.listen))
    finally:
        # The stdio transport closes stdout when the client leaves; the exit path still flushes it.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115


def _require_session(session: str) -> None:
    """Refuse a session no call could be gated under (the gate refused each call, after the proxy started)."""
    from agents.gateway.services import MAX_SESSION_CHARS, require_name
    from agents.services.errors import InvalidInput

    try:
        require_name(session, "--session", MAX_SESSION_CHARS)
    except InvalidInput as exc:
        raise CliError(f"{exc.message}; nothing was started") from None


def _is_host_and_port(listen: str) -> bool:
    """Return whether `listen` names a host and a port (no host would listen on every interface)."""
    host, _, port = listen.rpartition(":")
    # ASCII digits, and few: isdigit() alone admits "²", which int() refuses.
    return bool(host) and port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535
