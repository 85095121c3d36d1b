"""The `mcp:` key of agentfast.yaml: an MCP server's tools as policy tools `mcp.<server>.<tool>`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agents.policy import ConfigError, parse

MCP = """
mcp:
  files:
    delete_file:
      rules:
        - {name: tmp, when: "args.path.startsWith('/tmp/')", action: allow}
    read_file: {risk: high, approvers: [user:alice]}
"""


def test_it_reads_mcp_tools_as_policy_tools(tmp_path: Path) -> None:
    policy = parse(yaml.safe_load(MCP), tmp_path / "agentfast.yaml")

    assert policy.tool_policy("mcp.files.delete_file").rules[0].name == "tmp"
    assert policy.tool_policy("mcp.files.read_file").approvers == ("user:alice",)
    assert not policy.tool_policy("mcp.files.list_dir").gated  # unlisted: the proxy's annotations decide


def test_it_refuses_a_tool_configured_twice(tmp_path: Path) -> None:
    raw = yaml.safe_load(MCP + "tool_overrides:\n  mcp.files.read_file: {risk: low}\n")

    with pytest.raises(ConfigError, match=r"tool_overrides\.mcp\.files\.read_file: configured under mcp: too"):
        parse(raw, tmp_path / "agentfast.yaml")


def test_it_names_the_key_of_a_bad_mcp_entry(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"mcp\.files\.read_file\.risk: must be one of low, high"):
        parse({"mcp": {"files": {"read_file": {"risk": "extreme"}}}}, tmp_path / "agentfast.yaml")


def test_it_refuses_two_mcp_entries_that_name_the_same_policy_tool(tmp_path: Path) -> None:
    # Server "files.archive" tool "purge" and server "files" tool "archive.purge" are both mcp.files.archive.purge:
    # kept silently, the second entry would replace the first's gate.
    raw = yaml.safe_load("""
mcp:
  files.archive:
    purge: {risk: high, approvers: [user:alice]}
  files:
    archive.purge: {risk: low}
""")

    with pytest.raises(ConfigError) as error:
        parse(raw, tmp_path / "agentfast.yaml")

    message = str(error.value)
    assert "mcp.files.archive.purge" in message and "mcp.files.archive" in message
    assert "\n" not in message
