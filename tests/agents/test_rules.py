"""Rules in agentfast.yaml: CEL conditions compiled at load, evaluated deny → grant → allow → ask, outcomes recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.cli import main as cli_main
from agents.models import Approval, AuditEntry, Run, RunEvent, SideEffect
from agents.policy import ConfigError, ToolPolicy, floor, load, parse
from agents.policy.rules import CallFacts, GrantMatch, denied, evaluate
from tests.conftest import ROOT, child_env
from tests.support import flows
from tests.support.policies import support_yaml

RULES = """
agents:
  support: {model: demo, tools: [lookup_order, refund_request, send_email]}
tool_overrides:
  refund_request:
    rules:
      - {name: small, when: "args.amount_cents <= 1000", action: allow}
      - {name: huge, when: "args.amount_cents > 100000", action: deny, reason: "too much"}
      - {name: large, when: "args.amount_cents > 5000", action: ask, approvers: [finance], quorum: 2}
"""


def _policy(text: str = RULES, tmp_path: Path | None = None) -> object:
    import yaml

    return parse(yaml.safe_load(text), Path("agentfast.yaml"), version="v1")


def _facts(amount: object, **more: object) -> CallFacts:
    return CallFacts(tool="refund_request", args={"order_id": "A1001", "amount_cents": amount, **more}, agent="support")


# -- evaluation order --------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "action", "rule"),
    [(500, "allow", "small"), (200_000, "deny", "huge"), (7500, "ask", "large"), (2500, "ask", "")],
)
def test_it_evaluates_deny_then_allow_then_ask_then_the_tools_settings(amount, action, rule):
    verdict = evaluate(_policy(), _facts(amount))

    assert (verdict.action, verdict.rule) == (action, rule)
    assert verdict.policy_version == "v1"


def test_it_lets_a_deny_rule_win_over_an_allow_rule_listed_before_it():
    policy = _policy(RULES.replace("args.amount_cents > 100000", "args.amount_cents < 800"))

    verdict = evaluate(policy, _facts(500))

    assert (verdict.action, verdict.rule, verdict.reason) == ("deny", "huge", "too much")


def test_it_lets_an_allow_rule_win_over_an_ask_rule():
    policy = _policy(RULES.replace("args.amount_cents > 5000", "args.amount_cents > 100"))

    assert evaluate(policy, _facts(500)).action == "allow"


def test_it_carries_the_ask_rules_approvers_and_quorum():
    verdict = evaluate(_policy(), _facts(7500))

    assert (verdict.approvers, verdict.quorum, verdict.decided_by) == (("finance",), 2, "")


def test_it_consults_a_grant_after_deny_rules_and_before_allow_rules():
    seen: list[int] = []

    def lookup(facts: CallFacts, tool: ToolPolicy) -> GrantMatch | None:
        seen.append(facts.args["amount_cents"])
        return GrantMatch(id="g1", action="allow")

    denied = evaluate(_policy(), _facts(200_000), grant_lookup=lookup)
    granted = evaluate(_policy(), _facts(500), grant_lookup=lookup)

    assert (denied.action, denied.rule) == ("deny", "huge")
    assert seen == [500]  # never asked once a deny rule decided
    assert (granted.action, granted.rule, granted.decided_by) == ("allow", "", "grant:g1")


def test_it_skips_grants_on_a_tool_that_turns_them_off():
    policy = _policy(RULES.replace("    rules:", "    grants: false\n    rules:"))

    verdict = evaluate(policy, _facts(2500), grant_lookup=lambda facts, tool: GrantMatch(id="g1", action="allow"))

    assert (verdict.action, verdict.grant_id) == ("ask", "")


def test_it_lets_an_unlisted_tool_run_without_a_rule():
    verdict = evaluate(_policy(), CallFacts(tool="lookup_order", args={"order_id": "A1001"}, agent="support"))

    assert (verdict.action, verdict.automatic) == ("allow", False)


def test_it_reads_tool_agent_run_and_now_in_conditions():
    text = RULES.replace(
        '"args.amount_cents <= 1000"',
        "\"tool == 'refund_request' && agent == 'support' && run.created_by == 'carol' && now > timestamp('2020-01-01T00:00:00Z')\"",
    )
    facts = CallFacts(tool="refund_request", args={"amount_cents": 2500}, agent="support", run={"created_by": "carol"})

    assert evaluate(_policy(text), facts).action == "allow"
    assert evaluate(_policy(text), _facts(2500)).action == "ask"


# -- failing closed ----------------------------------------------------------------


def test_it_fails_closed_when_a_condition_cannot_be_evaluated():
    verdict = evaluate(_policy(), CallFacts(tool="refund_request", args={"order_id": "A1001"}, agent="support"))

    # amount_cents missing: the deny rule counts as matching, the allow rule as not.
    assert (verdict.action, verdict.rule) == ("deny", "huge")
    assert "rule 'small' could not be evaluated" in verdict.reason
    assert "rule 'huge' could not be evaluated" in verdict.reason


def test_it_fails_closed_on_a_type_error_without_a_deny_rule():
    policy = _policy(RULES.replace("      - {name: huge", "      - {name: huge0, when: 'false', action: deny}\n#"))

    verdict = evaluate(policy, _facts("lots"))

    assert (verdict.action, verdict.rule) == ("ask", "large")
    assert "could not be evaluated" in verdict.reason


def test_it_fails_closed_when_a_condition_is_not_a_boolean():
    policy = _policy(RULES.replace('"args.amount_cents <= 1000"', '"args.amount_cents"'))

    verdict = evaluate(policy, _facts(500))

    assert verdict.action == "ask"
    assert "rule 'small' could not be evaluated (its condition gave int, not true or false)" in verdict.reason


# -- deny rules alone (an approval of a call that already waits) ----------------------

MORE_DENIALS = """
      - {name: frozen, when: "args.order_id.startsWith('A9')", action: deny}
      - {name: listed, when: "args.to.exists(r, r.endsWith('@x.com'))", action: deny, reason: "no x.com"}
"""


@pytest.mark.parametrize(
    "args",
    [
        {"order_id": "A1001", "amount_cents": 500, "to": []},  # allowed by a rule: no deny rule matches
        {"order_id": "A1001", "amount_cents": 7500, "to": []},  # asked
        {"order_id": "A1001", "amount_cents": 200_000, "to": []},  # the first deny rule
        {"order_id": "A9001", "amount_cents": 500, "to": []},  # a later deny rule, no reason of its own
        {"order_id": "A1001", "amount_cents": 500, "to": ["a@x.com"]},  # a macro's
        {"order_id": "A1001", "amount_cents": 500, "to": ["a@y.com"] * 1001},  # too wide for the macro: denies
        {"order_id": "A1001", "amount_cents": 500},  # `to` missing: the macro's rule cannot be evaluated
        {"order_id": 7, "amount_cents": 500, "to": []},  # a type error in a deny rule
    ],
)
def test_it_finds_by_the_deny_rules_alone_the_denial_the_whole_evaluation_finds(args):
    policy = _policy(RULES.rstrip() + MORE_DENIALS)
    facts = CallFacts(tool="refund_request", args=args, agent="support")

    verdict, denial = evaluate(policy, facts), denied(policy, facts)

    if verdict.action != "deny":
        assert denial is None
        return
    assert denial is not None
    assert (denial.action, denial.rule, denial.policy_version) == ("deny", verdict.rule, "v1")
    assert denial.reason.split("; ")[0] == verdict.reason.split("; ")[0]
    assert ("could not be evaluated" in denial.reason) <= ("could not be evaluated" in verdict.reason)


def test_it_evaluates_no_rule_for_a_denial_where_the_tool_has_no_deny_rule():
    policy = _policy(RULES.replace('action: deny, reason: "too much"', "action: ask"))

    assert denied(policy, _facts(200_000)) is None
    assert denied(policy, CallFacts(tool="lookup_order", args={}, agent="support")) is None


# -- errors at load ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ("args.amount_cents <= ", "Syntax error: mismatched input '<EOF>'"),
        ("args.amount_cents <= ", "(position 1:22)"),
        ("amount > 10", "unknown variable 'amount' (known: account, agent, args, now, run, tool) (position 1:1)"),
    ],
)
def test_it_refuses_a_bad_condition_naming_file_key_and_position(when, problem):
    text = RULES.replace('"args.amount_cents > 5000"', json.dumps(when))

    with pytest.raises(ConfigError) as caught:
        _policy(text)

    assert str(caught.value).startswith("agentfast.yaml: tool_overrides.refund_request.rules[2].when: ")
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("change", "key", "problem"),
    [
        (("name: huge", "name: small"), "rules", "two rules are named 'small'"),
        (("action: deny", "action: maybe"), "rules[1].action", "must be one of allow, deny, ask"),
        (("action: allow}", "action: allow, quorum: 2}"), "rules[0]", "approvers and quorum belong to ask rules"),
        (("quorum: 2}", "quorum: 0}"), "rules[2].quorum", "must be a whole number from 1 to 20"),
        (("action: deny,", "action: deny, extra: 1,"), "rules[1].extra", "unknown key"),
    ],
)
def test_it_refuses_a_malformed_rule(change, key, problem):
    with pytest.raises(ConfigError) as caught:
        _policy(RULES.replace(*change))

    assert f"agentfast.yaml: tool_overrides.refund_request.{key}: " in str(caught.value)
    assert problem in str(caught.value)


def test_it_refuses_rules_on_an_agents_own_tool_overrides():
    text = RULES.replace(
        "tools: [lookup_order, refund_request, send_email]}",
        "tools: [lookup_order, refund_request, send_email],"
        " tool_overrides: {lookup_order: {rules: [{name: any, action: allow}]}}}",
    )

    with pytest.raises(ConfigError) as caught:
        _policy(text)

    assert "agents.support.tool_overrides.lookup_order.rules: an agent's own tool_overrides may not carry rules" in str(
        caught.value
    )


def test_it_keeps_the_files_rules_when_an_agent_raises_the_gate():
    file = _policy().tool_policy("refund_request")

    combined = floor(file, ToolPolicy(hitl_mode="defer", grants=False))

    assert [rule.name for rule in combined.rules] == ["small", "huge", "large"]
    assert (combined.hitl_mode, combined.grants) == ("suspend", False)


def test_it_stops_every_command_at_start_on_a_bad_condition(tmp_path):
    path = tmp_path / "agentfast.yaml"
    path.write_text(RULES.replace('"args.amount_cents > 5000"', '"args.amount_cents >"'))

    done = subprocess.run(
        [sys.executable, "-m", "agents.cli", "runs", "list"],
        check=False,
        cwd=ROOT,
        env=child_env(AGENTFAST_CONFIG=str(path)),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 1
    assert done.stderr.startswith(f"agentfast: {path}: tool_overrides.refund_request.rules[2].when: Syntax error")
    assert "(position 1:20)" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_it_versions_the_policy_by_the_files_bytes(tmp_path):
    path = tmp_path / "agentfast.yaml"
    path.write_text(RULES)
    first = load(path).version
    path.write_text(RULES + "\n")

    assert len(first) == 12 and load(path).version != first


# -- outcomes of a run (the shipped demo rules) -------------------------------------


def test_it_runs_a_small_refund_at_once_and_records_the_rule_as_its_decision(db):
    run = flows.start("Refund order A1001 for 5.00 USD")

    assert run.status == Run.Status.COMPLETED
    assert SideEffect.objects.count() == 1
    approval = Approval.objects.get(run=run)
    assert (approval.status, approval.decided_by, approval.rule) == (
        "approved",
        "policy:small refunds",
        "small refunds",
    )
    assert approval.decided_at is not None and approval.policy_version == load(ROOT / "agentfast.yaml").version
    audit = AuditEntry.objects.get(approval_id=approval.id)
    assert (audit.source, audit.actor, audit.action, audit.outcome) == (
        "system",
        "policy:small refunds",
        "approved",
        "decided",
    )
    assert audit.detail["rule"] == "small refunds" and audit.detail["policy_version"] == approval.policy_version
    [event] = RunEvent.objects.filter(run=run, type="tool_call", data__tool="refund_request")
    assert event.data["policy"]["decided_by"] == "policy:small refunds"


def test_it_denies_a_huge_refund_telling_the_model_the_reason(db):
    run = flows.start("Refund order A1010 for 1,500.00 USD")

    assert run.status == Run.Status.COMPLETED
    assert not SideEffect.objects.exists()
    refund = [o for o in flows.tool_outputs(run) if o.get("error_code")]
    assert refund == [{"ok": False, "error_code": "POLICY_DENIED", "message": "refunds over 1,000.00 need a ticket"}]
    approval = Approval.objects.get(run=run)
    assert (approval.status, approval.decided_by) == ("rejected", "policy:huge refunds")
    assert AuditEntry.objects.get(approval_id=approval.id).detail["reason"] == "refunds over 1,000.00 need a ticket"
    assert "refunds over 1,000.00 need a ticket" in run.output


def test_it_asks_for_a_large_refund_recording_the_rule_quorum_and_version(db):
    run = flows.start("Refund order A1004 for 75.00 USD")

    assert run.status == Run.Status.SUSPENDED
    [approval] = flows.pending(run)
    assert (approval.rule, approval.quorum, approval.approvers) == ("large refunds", 2, [])
    assert approval.policy_version == load(ROOT / "agentfast.yaml").version
    assert not AuditEntry.objects.exists()  # nobody decided yet
    event = RunEvent.objects.get(run=run, type="approval_required")
    assert event.data["policy"]["rule"] == "large refunds"


def test_it_asks_by_the_tools_own_settings_when_no_rule_matches(db):
    run = flows.start("Refund order A1001 for 25.00 USD")

    [approval] = flows.pending(run)
    assert (approval.rule, approval.quorum) == ("", 1)
    assert "policy" not in RunEvent.objects.get(run=run, type="approval_required").data


@pytest.mark.parametrize(
    ("prompt", "status", "decided_by"),
    [
        ("Refund order A1001 for 5.00 USD", "completed", "policy:small refunds"),
        ("Refund order A1010 for 1500.00 USD", "completed", "policy:huge refunds"),
        ("Refund order A1004 for 75.00 USD", "suspended", ""),
    ],
)
def test_it_gives_every_outcome_through_the_cli(db, capsys, prompt, status, decided_by):
    code = cli_main(["runs", "start", "--agent", "support", "--inline", "--json", prompt])
    run = json.loads(capsys.readouterr().out)

    assert code == 0 and run["status"] == status
    assert Approval.objects.get(run_id=run["id"]).decided_by == decided_by


# -- policy check ------------------------------------------------------------------


def test_it_checks_a_call_without_running_anything(db, capsys):
    code = cli_main(
        ["policy", "check", "refund_request", '{"order_id": "A1004", "amount_cents": 7500}', "--agent", "support"]
    )
    out = capsys.readouterr().out

    assert code == 0
    assert "outcome:   ask" in out and "rule:      large refunds" in out
    assert "approvers: any reviewer" in out and "quorum:    2" in out
    assert not Run.objects.exists() and not Approval.objects.exists()


@pytest.mark.parametrize(
    ("amount", "action", "rule"),
    [(500, "allow", "small refunds"), (7500, "ask", "large refunds"), (150_000, "deny", "huge refunds")],
)
def test_it_checks_a_call_as_json(db, capsys, amount, action, rule):
    arguments = json.dumps({"order_id": "A1010", "amount_cents": amount})

    code = cli_main(["policy", "check", "refund_request", arguments, "--agent", "support", "--json"])
    body = json.loads(capsys.readouterr().out)

    assert code == 0
    assert (body["action"], body["rule"]) == (action, rule)
    assert body["quorum"] == (2 if action == "ask" else 1)


def test_it_says_whether_a_user_could_approve(db, capsys, alice):
    arguments = '{"order_id": "A1004", "amount_cents": 7500}'

    code = cli_main(["policy", "check", "refund_request", arguments, "--agent", "support", "--by", "alice", "--json"])
    body = json.loads(capsys.readouterr().out)

    assert code == 0 and (body["by"], body["could_approve"]) == ("alice", True)


def test_it_says_four_eyes_keep_the_runs_starter_from_approving(db, capsys, alice, agent_config):
    agent_config(support_yaml(four_eyes=True))
    arguments = '{"order_id": "A1004", "amount_cents": 7500}'

    code = cli_main(["policy", "check", "refund_request", arguments, "--agent", "support", "--by", "alice"])

    assert code == 0
    assert "by:        alice could not approve it (four eyes: they started the run)" in capsys.readouterr().out


EXTERNAL_POLICY = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money:
    rules:
      - {name: trusted bot, when: "account == 'billing-bot' && args.cents <= 100000", action: allow}
"""


@pytest.mark.parametrize(("account", "action"), [("billing-bot", "allow"), ("other-bot", "ask")])
def test_it_checks_an_external_agents_call_as_the_gate_would(db, capsys, agent_config, account, action):
    agent_config(EXTERNAL_POLICY)
    argv = ["wire_money", '{"cents": 5000}', "--agent", "billing", "--account", account, "--json"]

    code = cli_main(["policy", "check", *argv])
    body = json.loads(capsys.readouterr().out)

    assert code == 0 and body["action"] == action
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["refund_request", "[1]", "--agent", "support"], "ARGS_JSON must be a JSON object"),
        (["refund_request", "{", "--agent", "support"], "ARGS_JSON: not valid JSON"),
        (["nope", "{}", "--agent", "support"], "agent 'support' has no tool 'nope'"),
        (["refund_request", "{}", "--agent", "ghost"], "unknown agent 'ghost'"),
        (["refund_request", '{"order_id": "A1001", "amount_cents": 900000}', "--agent", "support"], "would refuse"),
        (
            ["refund_request", '{"order_id": "A1001", "amount_cents": 500}', "--agent", "support", "--by", "nobody"],
            "no active user",
        ),
    ],
)
def test_it_refuses_a_bad_check_in_one_line(db, capsys, argv, message):
    code = cli_main(["policy", "check", *argv])
    err = capsys.readouterr().err

    assert code == 1 and message in err and len(err.strip().splitlines()) == 1
