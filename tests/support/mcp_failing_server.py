"""An MCP server (stdio) whose tools fail below the tool level, for the MCP gateway's tests.

`cancel_order` answers the call with a JSON-RPC error (the server said no: the order is
shipped); `probe_host` exits mid-call, so the call gets no answer at all. Each call appends
a line to the file MCP_LEDGER names first, as tests/support/mcp_server.py does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import McpError

server: Server[object, object] = Server("orders")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@server.list_tools()
async def list_tools() -> list[types.Tool]:
    return [
        types.Tool(
            name="cancel_order",
            description="Cancel an order.",
            inputSchema=SCHEMA,
            annotations=types.ToolAnnotations(destructiveHint=True),
        ),
        types.Tool(
            name="probe_host",
            description="Probe a host (and crash).",
            inputSchema=SCHEMA,
            annotations=types.ToolAnnotations(readOnlyHint=True),
        ),
    ]


def _log(tool: str, name: object) -> None:
    with Path(os.environ["MCP_LEDGER"]).open("a") as file:
        file.write(json.dumps({"tool": tool, "name": name}) + "\n")


async def call_tool(request: types.CallToolRequest) -> types.ServerResult:
    """Answer every call below the tool level: a JSON-RPC error, or no answer (the process exits)."""
    name, arguments = request.params.name, request.params.arguments or {}
    _log(name, arguments.get("name"))
    if name == "probe_host":
        os._exit(1)
    raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message=f"order {arguments.get('name')} has shipped"))


# Registered as the raw handler: the decorator's would turn an exception into a tool result.
server.request_handlers[types.CallToolRequest] = call_tool


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
