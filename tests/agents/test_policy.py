"""agentfast.yaml: agents and tool risk; a bad file fails at start naming file, key, problem."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.policy import UNLISTED, AgentSpec, ConfigError, ToolPolicy, get_policy, load, parse
from tests.conftest import ROOT, child_env


def test_it_reads_the_shipped_config():
    policy = load(ROOT / "agentfast.yaml")

    support = policy.agent("support")
    assert support.model == "demo"
    assert set(support.tools) == {"lookup_order", "refund_request", "send_email", "ask_human"}
    refund = policy.tool_policy("refund_request")
    assert (refund.risk, refund.hitl_mode) == ("high", "suspend")
    assert [rule.action for rule in refund.rules] == ["deny", "allow", "ask"]
    assert policy.tool_policy("send_email").hitl_mode == "defer"


def test_it_treats_unlisted_tools_as_low_risk():
    policy = load(ROOT / "agentfast.yaml")

    assert policy.tool_policy("lookup_order").gated is False
    assert policy.tool_policy("refund_request").gated is True


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("agents: {support: {tools: [nope]}}", "agents.support.tools[0]", "unknown tool 'nope'"),
        ("tool_overrides: {refund_request: {risk: extreme}}", "tool_overrides.refund_request.risk", "must be one of"),
        ("tool_overrides: {send_email: {hitl_mode: later}}", "tool_overrides.send_email.hitl_mode", "must be one of"),
        ("tool_overrides: {send_email: {risk: high, mode: defer}}", "tool_overrides.send_email.mode", "unknown key"),
        ("agents: {support: {max_steps: many}}", "agents.support.max_steps", "whole number"),
        ("agents: {support: {model: gpt}}", "agents.support.model", "'demo' or 'openai:<model name>'"),
        ("agents: [support]", "agents", "must be a mapping"),
        ("agent: {}", "agent", "unknown key"),
        ("agents: {support: {tools: [lookup_order}", "not valid YAML", ""),
        ("tool_overrides: {refund_request: {risk: medium}}", "tool_overrides.refund_request.risk", "write high"),
        ("tool_overrides: {refund_request: {timeout_seconds: .inf}}", "timeout_seconds", "positive number"),
        ("tool_overrides: {refund_request: {timeout_seconds: true}}", "timeout_seconds", "positive number"),
        ("agents: {support: {tools: lookup_order}}", "agents.support.tools", "list of tool names"),
        ("agents: {support: {tool_overrides: {nope: {}}}}", "agents.support.tool_overrides.nope", "unknown tool"),
        ("agents: {1: {}}", "agents", "names must be text"),
        ('agents: {support: {system_prompt: "a\\0b"}}', "agents.support.system_prompt", "NUL"),
        ("[1, 2]", "(top level)", "must be a mapping, not list"),
    ],
)
def test_it_names_the_file_the_key_and_the_problem(tmp_path: Path, text: str, key: str, problem: str):
    path = tmp_path / "agentfast.yaml"
    path.write_text(text)

    with pytest.raises(ConfigError) as error:
        load(path)

    message = str(error.value)
    assert message.startswith(f"{path}: ")
    assert key in message and problem in message


def test_it_rereads_the_file_when_it_changes(agent_config):
    path = agent_config("agents: {one: {tools: []}}")
    assert set(get_policy().agents) == {"one"}

    path.write_text("agents: {two: {tools: []}}\n# changed")
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 5))
    assert set(get_policy().agents) == {"two"}


def test_it_refuses_to_start_with_a_bad_config(tmp_path: Path):
    path = tmp_path / "agentfast.yaml"
    path.write_text("tool_overrides: {refund_request: {risk: extreme}}")

    done = subprocess.run(
        [sys.executable, "-m", "agents.cli", "runs", "list"],
        cwd=ROOT,
        env=child_env(AGENTFAST_CONFIG=str(path)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 1
    assert (
        done.stderr.strip()
        == f"agentfast: {path}: tool_overrides.refund_request.risk: must be one of low, high, not 'extreme'"
    )


@pytest.mark.parametrize("content", [b"\xff\xfe\x00a\x00g\x00", b"\x89PNG\r\n\x1a\n\x00\x00", b"agents:\x00\x01\x02"])
def test_it_reports_a_binary_file_as_a_config_error(tmp_path: Path, content: bytes):
    path = tmp_path / "agentfast.yaml"
    path.write_bytes(content)

    with pytest.raises(ConfigError) as error:
        load(path)

    message = str(error.value)
    assert message.startswith(f"{path}: ") and "\n" not in message


def test_it_takes_a_key_with_no_value_for_its_default(tmp_path: Path):
    policy = parse({"agents": {"a": {"tools": None, "system_prompt": None}}, "tool_overrides": None}, tmp_path)

    assert policy.agent("a").tools == () and policy.agent("a").system_prompt == ""
    assert policy.tool_policy("refund_request") == UNLISTED


def test_it_gates_a_listed_tool_with_the_keys_left_out(tmp_path: Path):
    policy = parse({"tool_overrides": {"refund_request": {}}}, tmp_path)

    assert policy.tool_policy("refund_request") == ToolPolicy(risk="high", hitl_mode="suspend")
    assert policy.tool_policy("lookup_order") == ToolPolicy(risk="low")


def _agent(**overrides: dict[str, str]) -> AgentSpec:
    return AgentSpec(name="a", tool_overrides={tool: ToolPolicy(**rule) for tool, rule in overrides.items()})


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        ({"risk": "low"}, ("high", "suspend")),  # the file's gate stays
        ({"risk": "low", "hitl_mode": "defer"}, ("high", "suspend")),
        ({"hitl_mode": "defer"}, ("high", "suspend")),  # suspend never becomes defer
        ({}, ("high", "suspend")),
    ],
)
def test_it_keeps_the_files_gate_whatever_the_agent_says(tmp_path: Path, own: dict[str, str], expected: tuple):
    policy = parse({"tool_overrides": {"refund_request": {"risk": "high", "hitl_mode": "suspend"}}}, tmp_path)

    effective = policy.tool_policy("refund_request", agent=_agent(refund_request=own))

    assert (effective.risk, effective.hitl_mode) == expected


def test_it_lets_an_agent_add_gates(tmp_path: Path):
    policy = parse({"tool_overrides": {"send_email": {"hitl_mode": "defer", "timeout_seconds": 60}}}, tmp_path)
    agent = _agent(lookup_order={"risk": "high", "hitl_mode": "defer"}, send_email={"hitl_mode": "suspend"})

    assert policy.tool_policy("lookup_order", agent=agent) == ToolPolicy(risk="high", hitl_mode="defer")
    assert policy.tool_policy("send_email", agent=agent) == ToolPolicy(hitl_mode="suspend", timeout_seconds=60)
    assert policy.tool_policy("send_email", agent=_agent(send_email={"risk": "low"})).hitl_mode == "defer"


def test_it_compiles_the_projects_rules_without_importing_cels_command_line_tool():
    # Loading the policy at start compiles its CEL rules; the package's interactive tool
    # (prompt_toolkit) cost every process's start a part of a second.
    show = "import sys, django; django.setup(); print(sorted(m for m in sys.modules if m.split('.')[0] in ('cel', 'prompt_toolkit')))"
    env = child_env(AGENTFAST_CONFIG=str(ROOT / "agentfast.yaml"))  # the project's file: rules with `when`
    done = subprocess.run(
        [sys.executable, "-c", show], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['cel', 'cel.cel', 'cel.cli', 'cel.stdlib']"
