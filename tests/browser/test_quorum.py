"""Two reviewers in real Chromium decide a quorum-2 approval: alice's approval shows "1 of 2"
on bob's card without a reload, bob's approval decides it; on a question, alice's answer shows
on bob's card as she gives it, and so does the note she approved with."""

from __future__ import annotations

import pytest

from agents.models import Approval, Vote
from tests.agents.test_questions_allowed import QUORUM, SHOP, order
from tests.browser.conftest import wait_js
from tests.browser.test_inbox_flow import wait_live
from tests.support.flows import decide, pending, resume, start
from tests.support.policies import support_yaml

pytestmark = pytest.mark.browser

REFUND = "Refund order A1001 for 25.00 USD"


def test_it_needs_two_reviewers_and_shows_the_first_approval_live(agent_config, viewer, alice, bob, carol):
    agent_config(support_yaml(quorum=2))  # read by this process, which pauses the run below
    alices, bobs = viewer("alice"), viewer("bob")
    for person in (alices, bobs):
        wait_live(person.page)

    [approval] = pending(start(REFUND))
    card = f"#card-{approval.id}"
    for person in (alices, bobs):
        person.page.wait_for_selector(card)
        assert "0 of 2 approvals" in person.page.inner_text(card)

    alices.page.click(f"{card} [data-action=approve]")
    wait_js(alices.page, "s => document.querySelector(s)?.innerText.includes('1 of 2 approvals: alice')", arg=card)
    # Bob never reloads: the vote reaches his card over the websocket.
    wait_js(bobs.page, "s => document.querySelector(s)?.innerText.includes('1 of 2 approvals: alice')", arg=card)
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    bobs.screenshot("quorum-one-of-two")

    bobs.page.click(f"{card} [data-action=approve]")
    bobs.page.wait_for_selector(f"{card} .decided-line")
    assert "Approved by bob" in bobs.page.inner_text(card)
    alices.page.wait_for_selector(card, state="detached")  # decided: it leaves alice's inbox
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == (Approval.Status.APPROVED, "bob")
    assert sorted(Vote.objects.filter(approval=approval).values_list("voter", flat=True)) == ["alice", "bob"]
    assert alices.errors == [] and bobs.errors == []


def test_it_shows_the_next_approver_the_answer_given_before_theirs_live(agent_config, fake_openai, viewer, alice, bob):
    agent_config(SHOP.format(base_url=fake_openai.base_url, overrides=QUORUM))
    fake_openai.script(order("ship_order"))
    [question] = pending(resume(start("ship A1003", agent="shop")))
    alices, bobs = viewer("alice"), viewer("bob")
    for person in (alices, bobs):
        wait_live(person.page)
    card = f"#card-{question.id}"

    alices.page.fill(f"{card} input[name=answer]", "Tuesday, <b>after</b> 10:00")
    alices.page.click(f"{card} [data-action=approve]")

    # Bob never reloads: the vote redraws his card, with alice's words as text.
    said = "Answered so far: alice: “Tuesday, <b>after</b> 10:00”"
    wait_js(bobs.page, "([s, said]) => document.querySelector(s)?.innerText.includes(said)", arg=[card, said])
    assert bobs.page.locator(f"{card} .answers b").count() == 0
    assert (alices.errors, bobs.errors) == ([], [])


def test_it_shows_the_next_approver_why_the_first_approved_live(agent_config, viewer, alice, bob, carol):
    agent_config(support_yaml(quorum=2))
    [approval] = pending(start(REFUND))
    bobs = viewer("bob")
    wait_live(bobs.page)
    card = f"#card-{approval.id}"
    bobs.page.wait_for_selector(card)

    decide(approval, "approved", by="alice", note="Checked with <b>finance</b>: the limit holds")

    said = "Notes so far: alice: “Checked with <b>finance</b>: the limit holds”"
    wait_js(bobs.page, "([s, said]) => document.querySelector(s)?.innerText.includes(said)", arg=[card, said])
    assert bobs.page.locator(f"{card} .notes b").count() == 0
    bobs.screenshot("quorum-notes-so-far")
    assert bobs.errors == []
