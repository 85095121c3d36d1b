"""The policy pages (read-only, reviewers only), and automatic outcomes seen through the web and the API."""

from __future__ import annotations

import json
import re
from urllib.parse import urlencode

import pytest

from agents import runtime, services
from agents.models import Approval, Run
from tests.support.flows import start
from tests.support.policies import support_yaml


def _check(client, tool: str = "refund_request", **params: str):
    return client.get(f"/policy/{tool}?{urlencode(params)}")


def test_it_lists_each_tool_with_its_rules_in_evaluation_order(client_for, alice):
    html = client_for(alice).get("/policy").content.decode()

    assert "<code>refund_request</code>" in html and "<code>lookup_order</code>" in html
    names = re.findall(r"<strong>([^<]+)</strong>: when", html)
    assert names == ["huge refunds", "small refunds", "large refunds"]  # deny, allow, ask
    assert "“refunds over 1,000.00 need a ticket”" in html and "2 approvals" in html
    assert "Low risk: its calls run at once." in html  # lookup_order


def _summary(client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200
    return " ".join(response.content.decode().split())


@pytest.mark.parametrize("path", ["/policy", "/policy/refund_request"])
def test_it_shows_a_schedule_rule_in_its_place_instead_of_failing(client_for, alice, agent_config, path):
    rules = [
        {"name": "large refunds", "when": "args.amount_cents > 5000", "action": "ask", "quorum": 2},
        {"name": "night", "when": "now.getHours() >= 22", "action": "schedule", "at": "now + duration('9h')"},
    ]
    agent_config(support_yaml(rules=rules))

    html = _summary(client_for(alice), path)

    assert re.findall(r"<strong>([^<]+)</strong>: when", html) == ["night", "large refunds"]
    assert "hold the call until <code>now + duration(&#x27;9h&#x27;)</code>, then run it" in html


@pytest.mark.parametrize("path", ["/policy", "/policy/refund_request"])
def test_it_says_whom_a_rule_asks_and_what_the_clock_does_when_nobody_decides(client_for, alice, agent_config, path):
    rules = [
        {"name": "big", "when": "args.amount_cents > 5000", "action": "ask", "approvers": [], "quorum": 2},
        {"name": "odd", "when": "args.amount_cents == 4242", "action": "ask", "timeout": "30m"},
    ]
    agent_config(support_yaml(approvers=["finance"], timeout="4h", on_timeout="approve", rules=rules))

    html = _summary(client_for(alice), path)

    assert "one of finance, within 4h, then approved by the clock." in html
    # An empty list is any reviewer, not the tool's finance; a rule takes the deadline keys it leaves out.
    assert "ask any reviewer, 2 approvals, within 4h, then approved by the clock" in html
    assert "ask finance, within 30m, then approved by the clock" in html


def test_it_shows_one_tools_settings_and_the_check_box(client_for, alice):
    html = client_for(alice).get("/policy/refund_request").content.decode()

    assert "A person decides (suspend" in html and "any reviewer" in html
    assert 'name="args"' in html and '<option value="support" selected>' in html


@pytest.mark.parametrize(
    ("amount", "badge", "words"),
    [
        (500, "allow", "runs at once, allowed by policy:small refunds"),
        (7500, "ask", "asks (suspend) by rule &#x27;large refunds&#x27;: 2 approval(s) from any reviewer"),
        (150_000, "deny", "denied by policy:huge refunds: refunds over 1,000.00 need a ticket"),
    ],
)
def test_it_checks_a_call_in_the_page(client_for, alice, amount, badge, words):
    args = json.dumps({"order_id": "A1010", "amount_cents": amount})

    response = _check(client_for(alice), args=args, agent="support")

    html = response.content.decode()
    assert response.status_code == 200
    assert f'<span class="badge">{badge}</span> {words}' in html
    assert not Run.objects.exists() and not Approval.objects.exists()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"args": "[1]", "agent": "support"}, "arguments: must be a JSON object"),
        ({"args": "{", "agent": "support"}, "arguments: not valid JSON"),
        ({"args": "{}", "agent": "ghost"}, "unknown agent &#x27;ghost&#x27;"),
        ({"args": '{"order_id": "A1001", "amount_cents": 900000}', "agent": "support"}, "the tool would refuse"),
    ],
)
def test_it_refuses_a_bad_check_with_a_clear_400(client_for, alice, params, message):
    response = _check(client_for(alice), **params)

    assert response.status_code == 400 and message in response.content.decode()


def test_it_escapes_what_the_check_echoes(client_for, alice):
    html = _check(client_for(alice), args='{"x": "<script>alert(1)</script>"}', agent="support").content.decode()

    assert "<script>alert(1)" not in html and "&lt;script&gt;" in html


def test_it_shows_the_policy_only_to_reviewers(client, client_for, dave):
    assert client.get("/policy").status_code == 302  # to the sign-in page
    assert client_for(dave).get("/policy").status_code == 403
    assert client_for(dave).get("/policy/refund_request").status_code == 403


def test_it_answers_404_for_an_unknown_tool(client_for, alice):
    assert client_for(alice).get("/policy/nope").status_code == 404


def test_it_links_the_policy_from_the_nav(client_for, alice):
    assert '<a href="/policy"' in client_for(alice).get("/runs").content.decode()


# -- automatic outcomes on the run page and through the API -----------------------------


def test_it_shows_on_the_run_page_which_rule_allowed_a_call(client_for, alice):
    run = start("Refund order A1001 for 5.00 USD")

    html = client_for(alice).get(f"/runs/{run.id}").content.decode()

    assert "allowed by policy:small refunds" in html


def test_it_shows_on_the_run_page_which_rule_denied_a_call(client_for, alice):
    run = start("Refund order A1010 for 1500.00 USD")

    html = client_for(alice).get(f"/runs/{run.id}").content.decode()

    assert "denied by policy:huge refunds" in html and "POLICY_DENIED" in html


def test_it_shows_on_the_run_page_which_rule_asked(client_for, alice):
    run = start("Refund order A1004 for 75.00 USD")

    html = client_for(alice).get(f"/runs/{run.id}").content.decode()

    assert "asked by rule “large refunds”" in html


def test_it_shows_the_rule_as_the_actor_on_the_audit_page(client_for, carol):
    start("Refund order A1001 for 5.00 USD")

    html = client_for(carol).get("/audit").content.decode()

    assert "policy:small refunds" in html


@pytest.mark.parametrize(
    ("prompt", "status", "decided_by", "approval_status"),
    [
        ("Refund order A1001 for 5.00 USD", "completed", "policy:small refunds", "approved"),
        ("Refund order A1010 for 1500.00 USD", "completed", "policy:huge refunds", "rejected"),
        ("Refund order A1004 for 75.00 USD", "suspended", None, "pending"),
    ],
)
def test_it_gives_every_outcome_through_the_api(
    client, alice, django_capture_on_commit_callbacks, prompt, status, decided_by, approval_status
):
    headers = {"Authorization": f"Bearer {services.token_create(username='alice')[1]}"}
    with django_capture_on_commit_callbacks():  # the worker's drive is done here, inline
        created = client.post(
            "/api/runs", data={"agent": "support", "input": prompt}, content_type="application/json", headers=headers
        )
    runtime.drive(created.json()["id"])

    body = client.get(f"/api/runs/{created.json()['id']}", headers=headers).json()

    assert body["status"] == status
    [approval] = body["approvals"]
    assert (approval["status"], approval["decided_by"]) == (approval_status, decided_by)


EXTERNAL = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money:
    approvers: [finance]
    rules:
      - {name: small, when: "args.cents <= 1000", action: allow}
"""


def test_it_shows_an_external_tools_settings_from_the_link_the_list_gives(client_for, alice, agent_config):
    agent_config(EXTERNAL)
    client = client_for(alice)
    listed = client.get("/policy").content.decode()
    assert '<a href="/policy/wire_money"><code>wire_money</code></a>' in listed

    page = client.get("/policy/wire_money")

    html = page.content.decode()
    assert page.status_code == 200
    assert "one of finance" in html and "<strong>small</strong>: when <code>args.cents &lt;= 1000</code>" in html
    assert 'name="account"' in html and "An external tool" in html
    assert client.get("/policy/no_such_tool").status_code == 404


@pytest.mark.parametrize(
    ("cents", "verdict"), [(500, "runs at once, allowed by policy:small"), (5000, "1 approval(s) from finance")]
)
def test_it_checks_an_external_agents_call_as_the_gate_would(client_for, alice, agent_config, cents, verdict):
    agent_config(EXTERNAL)
    query = {"account": "billing-bot", "agent": "billing", "args": json.dumps({"cents": cents})}

    page = client_for(alice).get("/policy/wire_money", query)

    assert page.status_code == 200 and verdict in page.content.decode()


@pytest.mark.parametrize(
    ("account", "said"), [(" ", "name the agent account"), ("x" * 151, "at most 150 characters"), ("a\x00b", "NUL")]
)
def test_it_asks_for_the_account_an_external_call_is_checked_for(client_for, alice, agent_config, account, said):
    agent_config(EXTERNAL)

    page = client_for(alice).get("/policy/wire_money", {"account": account, "args": "{}"})

    assert page.status_code == 400 and said in page.content.decode()


def test_it_lists_and_shows_a_tool_whose_name_has_a_slash(client_for, alice, agent_config):
    agent_config(EXTERNAL.replace("wire_money", "bank/wire_money"))
    client = client_for(alice)

    listed = client.get("/policy")

    assert listed.status_code == 200
    assert '<a href="/policy/bank/wire_money"><code>bank/wire_money</code></a>' in listed.content.decode()
    page = client.get("/policy/bank/wire_money")
    assert page.status_code == 200 and "one of finance" in page.content.decode()
