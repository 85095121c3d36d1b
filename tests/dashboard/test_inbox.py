"""The inbox: pending approvals as cards, longest waiting first, filtered, paginated, counted."""

from __future__ import annotations

import re

from agents.models import Approval
from dashboard.web import inbox
from tests.dashboard.conftest import REFUND
from tests.support.flows import decide, pending, start

EMAIL = "Email bob@example.com that his refund is on its way"


def card_ids(html: str) -> list[str]:
    return re.findall(r'<article id="card-([^"]+)"', html)


def card_html(html: str, approval_id: str) -> str:
    start = html.index(f'<article id="card-{approval_id}"')
    return html[start : html.index("</article>", start)]


def test_it_lists_pending_approvals_oldest_first_with_the_count_in_the_title(client_for, alice):
    first, second = pending(start(REFUND))[0], pending(start(EMAIL))[0]
    decided = pending(start(REFUND))[0]
    decide(decided, "rejected")

    response = client_for(alice).get("/")

    html = response.content.decode()
    assert response.status_code == 200
    assert card_ids(html) == [first.id, second.id]
    assert card_ids(client_for(alice).get("/?order=newest").content.decode()) == [second.id, first.id]
    assert "<title>(2) Inbox · agentfast</title>" in html
    assert 'data-count="2"' in html


def test_it_shows_what_a_reviewer_needs_on_a_card(client_for, alice, approval):
    html = client_for(alice).get("/").content.decode()

    assert "refund_request" in html and approval.run_id in html
    assert "&quot;amount_cents&quot;: 2500" in html  # pretty JSON, escaped
    assert "suspend" in html and "support" in html and "waiting" in html
    assert REFUND in html
    assert f'hx-post="/approvals/{approval.id}/decide"' in html


def test_it_filters_by_agent_and_tool(client_for, alice):
    refund, email = pending(start(REFUND))[0], pending(start(EMAIL))[0]
    client = client_for(alice)

    assert card_ids(client.get("/?tool=send_email").content.decode()) == [email.id]
    assert card_ids(client.get("/?tool=refund_request&agent=support").content.decode()) == [refund.id]
    filtered = client.get("/?agent=nobody").content.decode()
    assert card_ids(filtered) == [] and "No approvals waiting for these filters" in filtered
    # The live socket filters the same way.
    assert (
        'ws-connect="/ws/inbox/?tool=send_email&amp;page=1&amp;last=1"'
        in client.get("/?tool=send_email").content.decode()
    )


def test_it_paginates(client_for, alice, monkeypatch):
    monkeypatch.setattr(inbox, "INBOX_PAGE_SIZE", 2)
    ids = [pending(start(REFUND))[0].id for _ in range(3)]
    client = client_for(alice)

    first, second = client.get("/").content.decode(), client.get("/?page=2").content.decode()

    assert card_ids(first) == ids[:2] and card_ids(second) == ids[2:]
    assert "Page 1 of 2" in first and f'href="?page=2&amp;after={ids[1]}"' in first
    assert 'ws-connect="/ws/inbox/?page=1&amp;last=0"' in first
    assert 'ws-connect="/ws/inbox/?page=2&amp;last=1"' in second


def test_it_shows_a_later_page_in_order_whichever_way_it_is_sorted(client_for, alice, monkeypatch):
    monkeypatch.setattr(inbox, "INBOX_PAGE_SIZE", 2)
    ids = [pending(start(REFUND))[0].id for _ in range(5)]
    client = client_for(alice)

    assert card_ids(client.get("/?page=2").content.decode()) == ids[2:4]
    assert card_ids(client.get("/?page=3").content.decode()) == ids[4:]
    assert card_ids(client.get("/?page=2&order=newest").content.decode()) == [ids[2], ids[1]]
    decide(ids[3], "approved", auto_resume=False)
    assert card_ids(client.get("/?page=2").content.decode()) == [ids[2], ids[4]]


def test_it_explains_what_to_do_when_nothing_waits(client_for, alice):
    html = client_for(alice).get("/").content.decode()

    assert "No approvals waiting." in html
    assert "agentfast runs start --agent support" in html
    assert "<title>Inbox · agentfast</title>" in html


def test_it_answers_htmx_with_the_list_partial_and_its_count(client_for, alice, approval):
    response = client_for(alice).get("/", headers={"HX-Request": "true"})

    html = response.content.decode()
    assert card_ids(html) == [approval.id]
    assert "<html" not in html and 'id="inbox-cards"' in html
    assert 'id="pending-count" class="count" data-count="1" hx-swap-oob="true"' in html


def test_it_keeps_the_list_fragment_out_of_the_cache_of_the_inbox_url(client_for, alice, approval):
    client = client_for(alice)

    for response in (client.get("/", headers={"HX-Request": "true"}), client.get("/")):
        assert "HX-Request" in response["Vary"]
        assert "no-store" in response["Cache-Control"]


def test_it_approves_from_a_card_and_answers_with_the_decided_card(client_for, alice, approval):
    response = client_for(alice).post(
        f"/approvals/{approval.id}/decide",
        {"decision": "approved"},
        headers={"HX-Request": "true", "HX-Target": f"card-{approval.id}"},
    )

    html = response.content.decode()
    assert response.status_code == 200
    assert card_ids(html) == [approval.id] and "decided" in html
    assert "<strong>Approved</strong> by alice" in html
    assert Approval.objects.get(pk=approval.id).status == "approved"


def test_it_rejects_from_a_card_with_a_note(client_for, alice, approval):
    response = client_for(alice).post(
        f"/approvals/{approval.id}/decide",
        {"decision": "rejected", "note": "customer already refunded"},
        headers={"HX-Request": "true", "HX-Target": f"card-{approval.id}"},
    )

    assert response.status_code == 200
    assert "<strong>Rejected</strong> by alice" in response.content.decode()
    approval.refresh_from_db()
    assert (approval.status, approval.note) == ("rejected", "customer already refunded")


def test_it_asks_for_an_answer_on_a_questions_card(client_for, alice):
    [question] = pending(start("Ask a human whether to expedite order A1003"))
    [refund] = pending(start(REFUND))

    html = client_for(alice).get("/").content.decode()

    question_card, refund_card = card_html(html, question.id), card_html(html, refund.id)
    assert re.search(r'<input type="text" name="answer" required', question_card)
    assert f'form="answer-{question.id}" class="primary" data-action="approve">Approve with answer<' in question_card
    assert 'hx-vals=\'{"decision": "approved"}\'' not in question_card  # no approval without the answer
    assert 'name="answer"' not in refund_card and ">Approve</button>" in refund_card


def test_it_counts_no_further_than_its_cap_and_pages_on_without_a_total(client_for, alice, monkeypatch):
    from agents import selectors

    monkeypatch.setattr(inbox, "INBOX_COUNT_CAP", 2)
    monkeypatch.setattr(inbox, "INBOX_PAGE_SIZE", 2)
    ids = [pending(start(REFUND))[0].id for _ in range(3)]
    client = client_for(alice)

    first, second = client.get("/").content.decode(), client.get("/?page=2").content.decode()

    assert card_ids(first) == ids[:2] and card_ids(second) == ids[2:]
    assert "<title>(2+) Inbox · agentfast</title>" in first and 'data-count="2+"' in first
    assert "Page 1</span>" in first and f'href="?page=2&amp;after={ids[1]}"' in first and "Page 1 of" not in first
    # A bounded read, not a COUNT(*) of every pending approval.
    everything = Approval.objects.all()
    assert selectors.count_up_to(everything, 2) == 2 and selectors.count_up_to(everything, 9) == 3


def test_a_search_whose_matches_fit_one_page_is_read_once(client_for, alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    [refund] = pending(start(REFUND))
    pending(start("Ask a human whether to expedite order A1003"))
    client = client_for(alice)

    def approval_reads(query: dict[str, str]) -> tuple[str, list[str]]:
        with CaptureQueriesContext(connection) as queries:
            html = client.get("/", query).content.decode()
        return html, [q["sql"] for q in queries.captured_queries if 'FROM "agents_approval"' in q["sql"]]

    found, found_reads = approval_reads({"q": "A1001"})
    none, none_reads = approval_reads({"q": "no call holds this"})

    assert card_ids(found) == [refund.id] and 'data-count="1"' in found
    assert card_ids(none) == [] and 'data-count="0"' in none
    # Each search scans what it cannot rule out once: for its page, with no count after it.
    assert not any("COUNT(" in sql for sql in found_reads + none_reads)
