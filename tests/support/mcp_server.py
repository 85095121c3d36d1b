"""A tiny MCP server (stdio, or streamable HTTP with --http PORT) for the MCP gateway's tests: read-only, destructive and unannotated tools.

Each call of a tool appends a line to the file MCP_LEDGER names, so a test can count how
many times the upstream really ran it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

server = FastMCP(os.environ.get("MCP_SERVER_NAME", "notes"))  # another name: what a proxy makes of it


def _log(tool: str, name: str) -> None:
    ledger = os.environ.get("MCP_LEDGER")
    if ledger:
        with Path(ledger).open("a") as file:
            file.write(json.dumps({"tool": tool, "name": name}) + "\n")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def read_note(name: str) -> str:
    """Read a note."""
    _log("read_note", name)
    return f"the note {name} says hello"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def dump_note(name: str) -> str:
    """Dump a note as stored, a NUL byte and all (text agentfast must repair to keep)."""
    _log("dump_note", name)
    return f"{name}\x00raw"


@server.tool(annotations=ToolAnnotations(destructiveHint=True))
def delete_note(name: str) -> str:
    """Delete a note for good."""
    _log("delete_note", name)
    return f"deleted {name}"


@server.tool()
def rename_note(name: str, to: str) -> str:
    """Rename a note (no annotations: asked by default)."""
    _log("rename_note", name)
    return f"renamed {name} to {to}"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":  # streamable HTTP at http://127.0.0.1:PORT/mcp
        server.settings.port = int(sys.argv[2])
        server.run("streamable-http")
    else:
        server.run()
