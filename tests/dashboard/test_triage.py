"""Triage: one-line summaries, risk, grouped calls, edits shown, search, saved filters and bulk decisions."""

from __future__ import annotations

import re

import pytest
from django.http import QueryDict

from agents.models import Approval, AuditEntry
from agents.tools.registry import format_date, format_money, summarize
from tests.dashboard.conftest import REFUND
from tests.dashboard.test_inbox import card_html, card_ids
from tests.support.flows import decide, pending, start
from tests.support.policies import support_yaml

EMAIL = "Email bob@example.com that his refund is on its way"
TWO_REFUNDS = "Refund orders A1002 and A1003 for 25.00 USD"


def test_it_fills_a_tools_summary_with_money_and_dates():
    template = "Refund {amount_cents|money} on {order_id} by {due|date}"

    assert summarize({"amount_cents": 250000, "order_id": "A1010", "due": "2026-12-02"}, template=template) == (
        "Refund 2,500.00 on A1010 by 2 Dec 2026"
    )
    assert format_money(-5) == "-0.05" and format_date("2026-12-02T14:05:00+00:00") == "2 Dec 2026 14:05"


def test_it_lists_the_key_arguments_when_a_tool_has_no_summary_or_it_does_not_fit():
    arguments = {"to": "bob@example.com", "subject": "Hi", "body": "x" * 100, "cc": "c"}

    assert summarize(arguments) == f"to: bob@example.com · subject: Hi · body: {'x' * 39}… …"
    # A placeholder the arguments do not have (or a boolean as money) falls back to the arguments.
    assert summarize({"amount_cents": True}, template="Refund {amount_cents|money}") == "amount_cents: true"
    assert summarize({"a": 1}, template="{missing}") == "a: 1"


def test_it_shows_a_summary_risk_and_the_arguments_folded_on_each_card(client_for, alice, approval):
    html = card_html(client_for(alice).get("/").content.decode(), approval.id)

    assert f'id="summary-{approval.id}" href="/approvals/{approval.id}">Refund 25.00 on A1001</a>' in html
    assert '<span class="badge risk-high">high risk</span>' in html and 'data-risk="high"' in html
    assert '<details class="args-box">' in html and "&quot;amount_cents&quot;: 2500" in html
    assert "in its run" not in html  # a lone call is not grouped


def test_it_groups_the_calls_of_one_run(client_for, alice):
    first, second = pending(start(TWO_REFUNDS))

    html = client_for(alice).get("/").content.decode()

    assert card_ids(html) == [first.id, second.id]
    assert "1 of 2 in its run" in card_html(html, first.id) and "2 of 2 in its run" in card_html(html, second.id)


def test_it_shows_a_reviewers_edit_as_old_and_new_on_the_card_and_the_timeline(client_for, alice, bob, agent_config):
    agent_config(support_yaml(quorum=2))
    [approval] = pending(start("Refund order A1003 for 60.00 USD"))
    decide(approval, "approved", by="bob", arguments={"order_id": "A1003", "amount_cents": 5500})

    html = card_html(client_for(alice).get("/").content.decode(), approval.id)

    assert "<code>amount_cents</code>: <del>6000</del> → <ins>5500</ins>" in html
    assert "Refund 55.00 on A1003" in html  # the summary reads the arguments that would run
    decide(approval, "approved", by="alice")
    timeline = client_for(alice).get(f"/runs/{approval.run_id}").content.decode()
    assert "Runs with the edited arguments:" in timeline and "&quot;amount_cents&quot;: 5500" in timeline


def test_it_searches_tool_arguments_and_the_runs_input(client_for, alice):
    refund, email = pending(start(REFUND))[0], pending(start(EMAIL))[0]
    client = client_for(alice)

    assert card_ids(client.get("/?q=a1001").content.decode()) == [refund.id]  # an argument, any case
    assert card_ids(client.get("/?q=send_email").content.decode()) == [email.id]  # the tool
    assert card_ids(client.get("/?q=way").content.decode()) == [email.id]  # the run's input
    assert card_ids(client.get("/?q=refund+bob").content.decode()) == [email.id]  # every word must match
    empty = client.get("/?q=nothing-like-this").content.decode()
    assert card_ids(empty) == [] and "No approvals waiting for these filters" in empty


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("show=all&tool=refund_request&q=A1001&order=bogus", "Order: Select a valid choice. bogus is not one"),
        ("show=all&tool=refund_request&q=A1001%00", "Search: Null characters are not allowed."),
        ("show=all&tool=refund_request&q=" + "A1001" * 41, "Search: Ensure this value has at most 200 characters"),
    ],
    ids=["order", "nul", "long"],
)
def test_it_names_a_filter_that_does_not_read_and_keeps_the_others_and_the_text(client_for, alice, query, named):
    refund, email = pending(start(REFUND))[0], pending(start(EMAIL))[0]

    response = client_for(alice).get(f"/?{query}")

    html = response.content.decode()
    assert response.status_code == 400 and named in html and 'id="filters-error" role="alert"' in html
    assert card_ids(html) == [refund.id] and email.id not in html  # the tool filter still applies
    assert '<option value="all" selected>All</option>' in html
    assert '<option value="refund_request" selected>refund_request</option>' in html
    typed = QueryDict(query)["q"]
    assert f'name="q" value="{typed}"' in html  # the search box keeps what was typed
    # The live list follows the filters that apply, and is fetched again from this URL.
    assert re.search(r'ws-connect="/ws/inbox/\?show=all&amp;tool=refund_request(&amp;q=A1001)?&amp;page=1', html)
    assert "order=bogus" not in html.split('ws-connect="', 1)[1].split('"', 1)[0]


def test_it_saves_filters_per_reviewer_keeping_only_the_filters(client_for, alice, bob):
    client = client_for(alice)

    saved = client.post("/inbox/filters", {"name": "Big refunds", "query": "tool=refund_request&q=A10&evil=1"})

    assert saved.status_code == 302 and saved["Location"] == "/?tool=refund_request&q=A10"
    assert '<a href="/?tool=refund_request&amp;q=A10">Big refunds</a>' in client.get("/").content.decode()
    assert "Big refunds" not in client_for(bob).get("/").content.decode()
    client.post("/inbox/filters", {"name": "Big refunds", "forget": "1"})
    assert "Big refunds" not in client.get("/").content.decode()


def test_it_refuses_a_saved_filter_without_a_usable_name(client_for, alice):
    for name in ("", "\x00x"):
        response = client_for(alice).post("/inbox/filters", {"name": name, "query": ""})
        assert response.status_code == 400


def test_it_answers_a_blank_saved_filter_name_with_the_inbox_the_message_and_the_name(client_for, alice):
    refund, email = pending(start(REFUND))[0], pending(start(EMAIL))[0]
    client = client_for(alice)

    response = client.post("/inbox/filters", {"name": "   ", "query": "tool=refund_request&q=A10"})

    html = response.content.decode()
    assert response.status_code == 400 and response["Content-Type"].startswith("text/html")
    assert '<p class="error" id="save-filter-error" role="alert">Give the filter a name. Nothing was saved.</p>' in html
    assert 'name="name" maxlength="60" required autocomplete="off" value="   " aria-invalid="true"' in html
    assert '<input type="hidden" name="query" value="tool=refund_request&amp;q=A10">' in html
    assert card_ids(html) == [refund.id] and email.id not in html  # the inbox those filters show
    assert 'hx-get="/?tool=refund_request&amp;q=A10"' in html  # re-fetched from the inbox, not from the POST
    assert "Saved:" not in client.get("/").content.decode()


def test_it_decides_several_cards_each_audited_and_says_what_succeeded(client_for, alice):
    refund, email = pending(start(REFUND))[0], pending(start(EMAIL))[0]
    taken = pending(start(REFUND))[0]
    decide(taken, "rejected", by="bob")
    cards = [f"{a.id}:{a.digest}" for a in (refund, email, taken)]

    response = client_for(alice).post("/approvals/bulk", {"decision": "approved", "note": "ok", "cards": cards})

    html = response.content.decode()
    assert response.status_code == 200 and "2 of 3 approved" in html
    assert f"<code>{taken.id}</code></a>: not decided: someone decided it first" in html
    assert [Approval.objects.get(pk=a.id).status for a in (refund, email, taken)] == [
        "approved",
        "approved",
        "rejected",
    ]
    decided = AuditEntry.objects.filter(actor="alice", source="web", approval_id__in=[refund.id, email.id])
    assert decided.filter(outcome="decided").count() == 2
    assert AuditEntry.objects.filter(actor="alice", approval_id=taken.id).exclude(outcome="decided").exists()


def test_it_refuses_in_bulk_what_the_reviewer_may_not_decide(client_for, alice, agent_config):
    agent_config(support_yaml(approvers=["user:bob"]))
    refund, email = pending(start(REFUND))[0], pending(start(EMAIL))[0]

    response = client_for(alice).post(
        "/approvals/bulk", {"decision": "rejected", "cards": [f"{refund.id}:{refund.digest}", f"{email.id}:"]}
    )

    html = response.content.decode()
    assert "1 of 2 rejected" in html and re.search(rf"<code>{refund.id}</code></a>: not decided: [^<]*bob", html)
    assert Approval.objects.get(pk=refund.id).status == "pending"
    assert AuditEntry.objects.filter(actor="alice", approval_id=refund.id, outcome="not_permitted").exists()


def test_it_binds_each_bulk_decision_to_the_arguments_shown(client_for, alice, approval):
    response = client_for(alice).post(
        "/approvals/bulk", {"decision": "approved", "cards": [f"{approval.id}:{'0' * 64}"]}
    )

    assert "0 of 1 approved" in response.content.decode()
    assert Approval.objects.get(pk=approval.id).status == "pending"


def test_it_reports_a_bulk_approval_short_of_its_quorum_as_a_vote_not_an_approval(client_for, alice):
    refund = pending(start(REFUND))[0]
    large = pending(start("Refund order A1004 for 75.00 USD"))[0]  # the "large refunds" rule: quorum 2
    cards = [f"{a.id}:{a.digest}" for a in (refund, large)]

    html = client_for(alice).post("/approvals/bulk", {"decision": "approved", "cards": cards}).content.decode()

    assert "1 of 2 approved" in html and "1 call still waits for more approvals" in html
    assert f"<code>{large.id}</code></a>: vote recorded (1 of 2 approvals: alice), still pending" in html
    assert f"<code>{refund.id}</code></a>: approved" in html
    assert [Approval.objects.get(pk=a.id).status for a in (refund, large)] == ["approved", "pending"]
    again = client_for(alice).post("/approvals/bulk", {"decision": "approved", "cards": cards[1:]}).content.decode()
    assert "0 of 1 approved" in again and "already voted (1 of 2 approvals: alice), still pending" in again


@pytest.mark.parametrize(
    "data",
    [{"decision": "approved"}, {"decision": "maybe", "cards": ["x:1"]}, {"decision": "approved", "cards": ["\x00:1"]}],
)
def test_it_refuses_a_bulk_request_it_cannot_read_and_changes_nothing(client_for, alice, approval, data):
    response = client_for(alice).post("/approvals/bulk", data)

    assert response.status_code == 400 and "Nothing was decided" in response.content.decode()
    assert Approval.objects.get(pk=approval.id).status == "pending"


def test_it_lets_only_reviewers_decide_in_bulk(client_for, dave, approval):
    response = client_for(dave).post("/approvals/bulk", {"decision": "approved", "cards": [f"{approval.id}:"]})

    assert response.status_code == 403 and Approval.objects.get(pk=approval.id).status == "pending"


def test_it_links_the_next_pending_call_after_a_decision(client_for, alice):
    first, second = pending(start(REFUND))[0], pending(start(EMAIL))[0]
    client = client_for(alice)

    page = client.get(f"/approvals/{second.id}").content.decode()
    assert f'href="/approvals/{first.id}" data-next' in page
    assert f'ws-connect="/ws/approvals/?id={second.id}"' in page
    answer = client.post(f"/approvals/{first.id}/decide", {"decision": "approved"}, headers={"HX-Request": "true"})
    assert f'href="/approvals/{second.id}" data-next' in answer.content.decode()
