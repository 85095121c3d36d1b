"""agentfast.yaml written with YAML's merge keys: a file that loads must mean what it shows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agents.policy import ConfigError, get_policy


def test_it_refuses_two_merge_keys_in_one_mapping(agent_config: Callable[[str], Path]):
    # A key written twice is refused, lest a later entry silently replace (and ungate) the one a
    # reader sees; two `<<:` in one mapping slipped past that check: PyYAML merged both, the later
    # winning, so refund_request loaded as low risk, running without asking anyone.
    agent_config(
        """
agents:
  support: {tools: [lookup_order, refund_request]}
tool_overrides:
  <<: {refund_request: {risk: high, approvers: [finance], four_eyes: true}}
  <<: {refund_request: {risk: low}}
"""
    )

    with pytest.raises(ConfigError, match="'<<' is given twice"):
        get_policy()


def test_it_still_merges_several_anchors_given_as_one_list(agent_config: Callable[[str], Path]):
    agent_config(
        """
agents:
  support: {tools: [lookup_order, refund_request, send_email]}
  other:
    tools: [lookup_order]
    tool_overrides: &gates
      refund_request: {risk: high}
      send_email: {risk: high, hitl_mode: defer}
tool_overrides:
  <<: [*gates, {lookup_order: {risk: high}}]
"""
    )

    policy = get_policy()

    assert {name: p.gated for name, p in policy.tool_overrides.items()} == {
        "refund_request": True,
        "send_email": True,
        "lookup_order": True,
    }


@pytest.mark.parametrize(
    "base_url", ["api.example.com/v1", "localhost:8000/v1", "https://", " https://api.example.com/v1"]
)
def test_it_refuses_an_agents_base_url_that_is_no_http_url(agent_config: Callable[[str], Path], base_url: str):
    # Loaded as written, every run of the agent failed after the SDK's retries with "Connection
    # error.", nothing saying the address in the file was the problem.
    agent_config(
        f"""
agents:
  support: {{model: "openai:gpt-4o-mini", base_url: "{base_url}", tools: [lookup_order]}}
"""
    )

    with pytest.raises(ConfigError, match=r"agents\.support\.base_url: .*http"):
        get_policy()


def test_it_still_takes_an_http_base_url(agent_config: Callable[[str], Path]):
    agent_config(
        """
agents:
  support: {model: "openai:llama3", base_url: "http://127.0.0.1:11434/v1", tools: [lookup_order]}
"""
    )

    assert get_policy().agent("support").base_url == "http://127.0.0.1:11434/v1"
