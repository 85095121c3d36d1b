"""agentfast.yaml: agents and tool risk; a bad file fails at start naming file, key, problem."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.policy import ConfigError, ToolPolicy, get_policy, load
from tests.conftest import ROOT, child_env


def test_it_reads_the_shipped_config():
    policy = load(ROOT / "agentfast.yaml")

    support = policy.agent("support")
    assert support.model == "demo"
    assert set(support.tools) == {"lookup_order", "refund_request", "send_email", "ask_human"}
    assert policy.tool_policy("refund_request") == ToolPolicy(risk="high", hitl_mode="suspend")
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
    )

    assert done.returncode == 1
    assert (
        done.stderr.strip()
        == f"agentfast: {path}: tool_overrides.refund_request.risk: must be one of low, medium, high, not 'extreme'"
    )
