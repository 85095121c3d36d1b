"""The lists at scale, as an attacker and a hurried admin use them: odd pages, odd filters, odd text."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from agents import services
from agents.models import Run
from agents.notify import dispatch
from agents.notify.models import Delivery
from agents.services import notify as notify_services
from tests.support import flows

EXTERNAL = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  wire_money: {risk: high}
"""


def _gate(arguments: dict[str, Any], call_id: str = "c1") -> str:
    """Ask for an external call as an agent account would; return the pending approval's id."""
    services.user_create(username=f"robot-{call_id}", role="agent")
    token = services.token_create(username=f"robot-{call_id}")[1]
    body = {"agent": "billing", "session": "thread-7", "call_id": call_id, "tool": "wire_money", "arguments": arguments}
    response = Client().post(
        "/api/gate", json.dumps(body), content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.json()["decision"] == "pending", response.content
    return str(response.json()["approval_id"])


# -- web pages: the page number ------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/runs", "/audit"])
@pytest.mark.parametrize("page", ["²", "①", "1" * 5000], ids=["superscript", "circled", "5000-digits"])
def test_it_shows_the_first_page_for_a_page_number_int_cannot_read(
    client_for: Callable[[User], Client], carol: User, paused: Run, path: str, page: str
) -> None:
    # "²" and "①" pass str.isdigit(); 5,000 digits pass it too but are over int()'s limit.
    response = client_for(carol).get(path, {"page": page})
    assert response.status_code == 200
    assert "Page 2" not in response.content.decode()


# -- inbox: search ---------------------------------------------------------------------------


@pytest.mark.parametrize("words", ["Müller", "Jürgen Müller", "Ωmega", 'say "hi"', r"C:\tmp"])
def test_it_finds_a_pending_call_by_words_of_its_arguments_that_json_escapes(
    client_for: Callable[[User], Client], alice: User, agent_config: Any, words: str
) -> None:
    agent_config(EXTERNAL)
    approval_id = _gate({"payee": "Jürgen Müller", "memo": 'Ωmega: say "hi" from C:\\tmp', "cents": 5})
    other = _gate({"payee": "Someone Else", "cents": 6}, call_id="c2")
    html = client_for(alice).get("/", {"show": "all", "q": words}).content.decode()
    assert approval_id in html
    assert other not in html


# -- API lists: parameters they do not take ------------------------------------------------


@pytest.mark.parametrize(
    ("path", "query", "field"),
    [
        ("/api/approvals", "stauts=approved", "stauts"),  # a typo: the pending ones were listed as if approved
        ("/api/approvals", "status=all&run_id=run_x", "run_id"),
        ("/api/runs", "tool=refund_request", "tool"),  # a filter of the other list
        ("/api/runs", "created_by=bob", "created_by"),  # the web page's filter, which this list lacks
        ("/api/runs", "limit=1&page=2", "page"),  # the web pages' paging
    ],
)
def test_it_refuses_a_list_parameter_it_does_not_take_naming_it(
    alice: User, paused: Run, path: str, query: str, field: str
) -> None:
    token = services.token_create(username="alice")[1]
    response = Client().get(f"{path}?{query}", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert field in response.json()["message"]


def test_it_still_takes_every_parameter_a_list_documents(alice: User, paused: Run) -> None:
    token = services.token_create(username="alice")[1]
    headers = {"Authorization": f"Bearer {token}"}
    query = "status=pending&agent=support&tool=refund_request&limit=1&offset=0&cursor="
    assert Client().get(f"/api/approvals?{query}", headers=headers).json()["count"] == 1
    runs = Client().get("/api/runs?status=suspended&agent=support&limit=1&offset=0&cursor=", headers=headers)
    assert runs.json()["count"] == 1


# -- runs page: the filters shown are the filters applied ----------------------------------


def _selected(html: str, name: str) -> list[str]:
    """Return the values of the options selected in the <select> of this name."""
    select = html.split(f'<select name="{name}"', 1)[1].split("</select>", 1)[0]
    return [part.split('"', 1)[0] for part in select.split('<option value="')[1:] if " selected" in part.split(">")[0]]


@pytest.mark.parametrize(
    ("path", "name", "value"),
    [
        ("/runs", "agent", "gone-agent"),
        ("/runs", "creator", "erin"),
        ("/", "agent", "gone-agent"),
        ("/", "tool", "send_email"),  # a saved filter for a tool nobody was asked about yet
    ],
)
def test_it_shows_a_list_filter_naming_no_listed_choice_as_selected(
    client_for: Callable[[User], Client], alice: User, paused: Run, path: str, name: str, value: str
) -> None:
    # A link to runs of an agent since renamed (or a person with no run yet) filters the list
    # to nothing: the select must say so, not "Any", or the empty list reads as "nothing at all".
    html = client_for(alice).get(path, {name: value, "show": "all"}).content.decode()
    assert paused.id not in html
    assert _selected(html, name) == [value]


# -- inbox: the pager's words follow the order ---------------------------------------------


@pytest.mark.parametrize(("order", "back", "on"), [("oldest", "← Older", "Newer →"), ("newest", "← Newer", "Older →")])
def test_it_names_the_inbox_pages_by_the_order_they_are_in(
    client_for: Callable[[User], Client],
    alice: User,
    paused: Run,
    monkeypatch: pytest.MonkeyPatch,
    order: str,
    back: str,
    on: str,
) -> None:
    # Oldest first (the default), the next page holds the newer calls: "Older →" sent a
    # hurried reviewer looking for older calls the wrong way.
    flows.start("Refund order A1002 for 15.00 USD")
    monkeypatch.setattr("dashboard.web.inbox.INBOX_PAGE_SIZE", 1)
    client = client_for(alice)
    first = client.get("/", {"show": "all", "order": order}).content.decode()
    second = client.get("/", {"show": "all", "order": order, "page": "2"}).content.decode()
    assert on in first and back not in first
    assert back in second and on not in second


# -- API lists: filters take every name the gate stores --------------------------------------

NAMED = """
agents:
  support: {tools: [lookup_order]}
tool_overrides:
  github/create_issue: {risk: high}
"""


@pytest.mark.parametrize("agent", ["Claude Desktop", "ops@acme", "Büro-Bot", "team/bot"])
def test_it_filters_the_api_lists_by_any_agent_and_tool_name_the_gate_took(
    alice: User, agent_config: Any, agent: str
) -> None:
    # The gate takes any plain agent name and tool names with "/": the lists' filters refused them.
    agent_config(NAMED)
    services.user_create(username="robot", role="agent")
    robot = {"Authorization": f"Bearer {services.token_create(username='robot')[1]}"}
    body = {"agent": agent, "session": "s1", "call_id": "c1", "tool": "github/create_issue", "arguments": {"n": 1}}
    gated = Client().post("/api/gate", json.dumps(body), content_type="application/json", headers=robot)
    approval_id = gated.json()["approval_id"]
    reviewer = {"Authorization": f"Bearer {services.token_create(username='alice')[1]}"}
    approvals = Client().get("/api/approvals", {"agent": agent, "tool": "github/create_issue"}, headers=reviewer)
    assert approvals.status_code == 200, approvals.content
    assert [item["id"] for item in approvals.json()["items"]] == [approval_id]
    runs = Client().get("/api/runs", {"agent": agent}, headers=reviewer)
    assert runs.status_code == 200, runs.content
    assert [item["agent"] for item in runs.json()["items"]] == [agent]


@pytest.mark.parametrize("name", ["a\x00b", "a\u200bb", "a\nb", "x" * 101])
def test_it_still_refuses_a_name_filter_no_name_can_be_naming_the_field(alice: User, name: str) -> None:
    reviewer = {"Authorization": f"Bearer {services.token_create(username='alice')[1]}"}
    response = Client().get("/api/approvals", {"agent": name}, headers=reviewer)
    assert response.status_code == 400
    assert response.json()["field"] == "agent"


# -- web lists: the next page starts after the last row shown --------------------------------


def _next_link(html: str) -> str:
    """Return the href of the pager's link to the next page, as the browser would follow it."""
    nav = html.split('<nav class="pager"', 1)[1].split("</nav>", 1)[0]
    link = next(part for part in nav.split("<a ")[1:] if "→" in part)
    return link.split('href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")


def test_it_shows_the_inbox_card_after_the_last_one_seen_when_one_before_it_was_decided(
    client_for: Callable[[User], Client], alice: User, paused: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Oldest first, a page of one: A on page 1; A is decided; "Newer →" skipped B for C.
    later = [flows.start(f"Refund order A100{n} for 1{n}.00 USD") for n in (2, 3)]
    first, second, third = (flows.pending(run)[0] for run in (paused, *later))
    monkeypatch.setattr("dashboard.web.inbox.INBOX_PAGE_SIZE", 1)
    client = client_for(alice)
    page_one = client.get("/", {"show": "all"}).content.decode()
    assert first.id in page_one
    flows.decide(first, "approved", by="bob")
    page_two = client.get("/" + _next_link(page_one)).content.decode()
    assert second.id in page_two and third.id not in page_two


def test_it_shows_the_audit_entries_after_the_last_one_seen_when_newer_ones_were_added(
    client_for: Callable[[User], Client], carol: User, paused: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Newest first, a page of one: decisions recorded meanwhile repeated page 1 on page 2.
    later = [flows.start(f"Refund order A100{n} for 1{n}.00 USD") for n in (2, 3)]
    for run in (paused, *later):
        flows.decide(flows.pending(run)[0], "rejected", note=f"no {run.id}")
    monkeypatch.setattr("dashboard.web.audit.AUDIT_PAGE_SIZE", 1)
    client = client_for(carol)
    page_one = client.get("/audit").content.decode()
    assert f"no {later[1].id}" in page_one
    flows.decide(flows.pending(flows.start("Refund order A1005 for 15.00 USD"))[0], "rejected", note="newest")
    page_two = client.get("/audit" + _next_link(page_one)).content.decode()
    assert f"no {later[0].id}" in page_two and f"no {later[1].id}" not in page_two


def test_it_shows_the_runs_after_the_last_one_seen_when_newer_ones_started(
    client_for: Callable[[User], Client], alice: User, paused: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    later = [flows.start(f"Refund order A100{n} for 1{n}.00 USD") for n in (2, 3)]
    monkeypatch.setattr("dashboard.web.runs.RUNS_PAGE_SIZE", 1)
    client = client_for(alice)
    page_one = client.get("/runs").content.decode()
    assert later[1].id in page_one
    flows.start("Refund order A1005 for 15.00 USD")
    page_two = client.get("/runs" + _next_link(page_one)).content.decode()
    assert later[0].id in page_two and later[1].id not in page_two


# -- metrics: notification failures are counted ----------------------------------------------

FAILING_WEBHOOK = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request]
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
notifications:
  - kind: webhook
    url: http://127.0.0.1:9/hook
    secret_env: NO_SUCH_SECRET_ENV
"""


def _failures(token: str) -> float:
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {token}"})
    [family] = [f for f in text_string_to_metric_families(response.content.decode()) if f.name.endswith("failures")]
    return float(next(sample.value for sample in family.samples if sample.name.endswith("_total")))


def test_it_counts_each_failed_notification_attempt_in_the_metrics(
    carol: User, agent_config: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # The figure was a constant 0 whatever failed: an alert on it could never fire.
    agent_config(FAILING_WEBHOOK)
    settings.AGENTFAST_METRICS_TOKEN = "s3cret-scrape"
    with django_capture_on_commit_callbacks(execute=True):
        flows.start("Refund order A1001 for 25.00 USD")
    delivery = Delivery.objects.get()
    assert _failures("s3cret-scrape") == 0
    dispatch.send(delivery.pk)  # nothing listens on port 9: a failed attempt
    dispatch.send(delivery.pk, force=True)
    assert _failures("s3cret-scrape") == 2
    notify_services.delivery_redeliver(
        delivery_id=delivery.pk, attempt=services.Attempt(actor="carol", source="cli", origin="tests")
    )
    assert _failures("s3cret-scrape") == 2  # a counter: sending again forgets no failure
