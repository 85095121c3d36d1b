"""agentfast.yaml files no person writes by hand: each is refused in one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User

from agents.policy.config import ConfigError, load, parse


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


def test_it_warns_at_start_of_a_listed_name_one_typo_away_from_a_tool_it_leaves_ungated(db, agent_config, capsys):
    from agents.policy.config import get_policy
    from dashboard.processes import _say_configuration_problems

    path = agent_config(TYPO)
    assert not get_policy().tool_policy("refund_request").gated  # taken for an external agent's tool, as documented

    _say_configuration_problems()

    [line] = [line for line in capsys.readouterr().err.splitlines() if "no group is named" not in line]
    assert line.startswith(f"agentfast: warning: {path}: tool_overrides.refund_requests: ")
    assert "'refund_request'" in line and "without asking anyone" in line
    # wire_money is like no registered tool: an external agent's, said nothing of.


CLOCK_APPROVES_LARGE = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request:
    risk: high
    timeout: 4h
    on_timeout: approve
    rules:
      - {name: large, when: "args.amount_cents > 100000", action: ask, quorum: 2}
      - {name: managers, when: "args.amount_cents > 50000", action: ask, approvers: [managers], on_timeout: reject}
"""


def test_it_warns_at_start_of_a_stricter_ask_rule_the_clock_still_approves(db, agent_config, capsys):
    from dashboard.processes import _say_configuration_problems

    path = agent_config(CLOCK_APPROVES_LARGE)
    Group.objects.create(name="managers")

    _say_configuration_problems()

    [line] = capsys.readouterr().err.splitlines()  # "managers" sets its own on_timeout: nothing to say of it
    assert line.startswith(f"agentfast: warning: {path}: tool_overrides.refund_request.rules.large: asks for 2 ")
    assert "the clock approves its calls" in line


def test_it_warns_at_start_of_a_stricter_ask_rule_whose_calls_escalate_to_the_tools_people(db, agent_config, capsys):
    from dashboard.processes import _say_configuration_problems

    escalating = CLOCK_APPROVES_LARGE.replace("on_timeout: approve", "on_timeout: escalate\n    escalate_to: [ops]")
    path = agent_config(escalating)
    Group.objects.create(name="managers")
    Group.objects.create(name="ops")

    _say_configuration_problems()

    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"agentfast: warning: {path}: tool_overrides.refund_request.rules.large: asks for 2 ")
    assert "its calls go at the deadline to the tool's escalate_to (ops)" in line


NAMES_NOBODY = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email]
    tool_overrides:
      send_email: {risk: high, approvers: ["user:ghost"]}
tool_overrides:
  refund_request:
    risk: high
    approvers: [finance, reviewer]
    rules:
      - name: large
        when: "args.amount_cents > 50000"
        action: ask
        approvers: [managers]
        timeout: 1h
        on_timeout: escalate
        escalate_to: ["user:alice", "user:bob"]
"""


def test_it_warns_at_start_of_approvers_that_name_nobody_who_can_decide(db, alice, bob, agent_config, capsys):
    # Calls only they may approve wait for ever, or run at their deadline under on_timeout: approve.
    from dashboard.processes import _say_configuration_problems

    path = agent_config(NAMES_NOBODY)
    User.objects.filter(username="bob").update(is_active=False)

    _say_configuration_problems()

    lines = [line.removeprefix(f"agentfast: warning: {path}: ") for line in capsys.readouterr().err.splitlines()]
    no_group, no_user = "so nobody it names can decide", "names nobody who can decide"
    assert lines == [
        f"tool_overrides.refund_request.approvers: no group is named 'finance', {no_group}",
        f"tool_overrides.refund_request.rules.large.approvers: no group is named 'managers', {no_group}",
        f"tool_overrides.refund_request.rules.large.escalate_to: 'bob' is no active user, so 'user:bob' {no_user}",
        f"agents.support.tool_overrides.send_email.approvers: 'ghost' is no active user, so 'user:ghost' {no_user}",
    ]


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"agents": {"a" * 101: {"tools": ["lookup_order"]}}}, "agents"),
        ({"tool_overrides": {"t" * 101: {"risk": "high"}}}, "tool_overrides"),
        ({"agents": {"support": {"tool_overrides": {"t" * 101: {}}}}}, "agents.support.tool_overrides"),
        ({"mcp": {"s" * 50: {"t" * 50: {"risk": "high"}}}}, "mcp"),
    ],
    ids=["agent", "tool", "agents-own-tool", "mcp-tool"],
)
def test_it_refuses_a_name_longer_than_a_run_or_an_approval_can_hold(tmp_path: Path, raw: dict, key: str):
    # Accepted, such an agent failed every start with "database error: value too long" (PostgreSQL),
    # and such a tool's calls could never be gated.
    path = tmp_path / "agentfast.yaml"

    with pytest.raises(ConfigError) as error:
        parse(raw, path)

    message = str(error.value)
    assert message.startswith(f"{path}: {key}: ") and "at most 100 characters" in message


def test_it_still_takes_a_name_of_100_characters(tmp_path: Path):
    raw = {"agents": {"a" * 100: {"tools": ["lookup_order"]}}, "tool_overrides": {"t" * 100: {"risk": "high"}}}

    policy = parse(raw, tmp_path / "agentfast.yaml")

    assert "a" * 100 in policy.agents and policy.tool_policy("t" * 100).gated


@pytest.mark.parametrize(
    ("entry", "keys"),
    [
        ({"risk": "low", "approvers": ["finance"]}, "approvers"),
        ({"risk": "low", "quorum": 2, "four_eyes": True}, "four_eyes, quorum"),
        ({"risk": "low", "timeout": "1h", "on_timeout": "approve"}, "on_timeout, timeout"),
        (
            {"risk": "low", "approvers": ["finance"], "rules": [{"name": "big", "when": "true", "action": "deny"}]},
            "approvers",
        ),
    ],
)
def test_it_refuses_who_decides_on_a_tool_nobody_is_asked_about(tmp_path: Path, entry: dict, keys: str):
    # `risk: low` runs every call at once: an entry naming approvers or a deadline beside it reads as a
    # gate that is not there.
    path = tmp_path / "agentfast.yaml"

    with pytest.raises(ConfigError) as error:
        parse({"tool_overrides": {"refund_request": entry}}, path)

    message = str(error.value)
    assert message.startswith(f"{path}: tool_overrides.refund_request: {keys} would never apply")


def test_it_still_takes_approvers_beside_risk_low_for_its_ask_rules(tmp_path: Path):
    rules = [{"name": "big", "when": "args.amount_cents > 5000", "action": "ask"}]
    entry = {"risk": "low", "approvers": ["finance"], "quorum": 2, "rules": rules}

    policy = parse({"tool_overrides": {"refund_request": entry}}, tmp_path / "agentfast.yaml")

    assert policy.tool_policy("refund_request").approvers == ("finance",)


REMINDERS = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email]
tool_overrides:
  refund_request:
    risk: high
    remind_every: 1s
    rules:
      - {name: large, when: "args.amount_cents > 100000", action: ask, remind_every: 30m}
      - {name: small, when: "args.amount_cents < 100", action: ask, remind_every: 0.001s}
  send_email: {risk: high, remind_every: 1h}
"""


def test_it_warns_at_start_of_reminders_under_a_minute_that_go_out_at_every_sweep(db, agent_config, capsys, settings):
    from dashboard.processes import _say_configuration_problems

    settings.AGENTFAST_SWEEP_SECONDS = 5
    path = agent_config(REMINDERS)

    _say_configuration_problems()

    said = [line for line in capsys.readouterr().err.splitlines() if "remind_every" in line]
    then = (
        "every approver of each waiting call is reminded that often (at each of beat's sweeps, every 5 s, at the "
        "most); write minutes or hours (30m, 4h) unless that is meant"
    )
    assert said == [
        f"agentfast: warning: {path}: tool_overrides.refund_request: remind_every is 1 s: {then}",
        f"agentfast: warning: {path}: tool_overrides.refund_request.rules.small: remind_every is 0.001 s: {then}",
    ]
