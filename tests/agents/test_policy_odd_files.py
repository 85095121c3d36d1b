"""agentfast.yaml files no person writes by hand: each is refused in one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.policy.config import ConfigError, load


@pytest.mark.parametrize(
    "nested", ["[" * 5000 + "]" * 5000, "{a: " * 3000 + "1" + "}" * 3000], ids=["lists", "mappings"]
)
def test_it_refuses_a_file_nested_too_deep_to_read_in_one_line(tmp_path: Path, nested: str):
    path = tmp_path / "agentfast.yaml"
    path.write_text(f"agents: {nested}\n")

    with pytest.raises(ConfigError) as error:
        load(path)

    message = str(error.value)
    assert message.startswith(f"{path}: not valid YAML: ")
    assert "nested" in message and "\n" not in message


TYPO = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email]
tool_overrides:
  refund_requests: {risk: high, approvers: [finance]}
  send_email: {risk: high, hitl_mode: defer}
  wire_money: {risk: high}
"""


def test_it_warns_at_start_of_a_listed_name_one_typo_away_from_a_tool_it_leaves_ungated(agent_config, capsys):
    from agents.policy.config import get_policy
    from dashboard.processes import _say_configuration_problems

    path = agent_config(TYPO)
    assert not get_policy().tool_policy("refund_request").gated  # taken for an external agent's tool, as documented

    _say_configuration_problems()

    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"agentfast: warning: {path}: tool_overrides.refund_requests: ")
    assert "'refund_request'" in line and "without asking anyone" in line
    # wire_money is like no registered tool: an external agent's, said nothing of.
