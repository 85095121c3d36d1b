"""A reviewer's feedback on a rejected deferred call reaches the model once, right after its rejection."""

from __future__ import annotations

import json
from typing import Any

from agents.models import Approval, Message, Run
from agents.runtime import outputs
from agents.runtime.execution import execute_deferred
from tests.agents.test_deferred import CONFIG
from tests.support.fake_openai import Reply, tool_messages
from tests.support.flows import decide, pending, resume, start

UPDATE = "Update on a deferred call: "
NOTE = "not to bob"
FEEDBACK = "write to carol instead"
EMAIL = ("call_mail", "send_email", json.dumps({"to": "bob@example.com", "subject": "Refund", "body": "on its way"}))
REFUND = ("call_refund", "refund_request", json.dumps({"order_id": "A1002", "amount_cents": 700}))
TO_CAROL = ("call_carol", "send_email", json.dumps({"to": "carol@example.com", "subject": "Refund", "body": "sent"}))


def told_after_update(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the messages of a request from the deferred call's update on."""
    messages = request["messages"]
    start = next(i for i, m in enumerate(messages) if m["role"] == "system" and m["content"].startswith(UPDATE))
    return messages[start:]


def feedback_given(request: dict[str, Any]) -> int:
    return sum(FEEDBACK in (m["content"] or "") for m in request["messages"])


def reject_the_email(run: Run) -> None:
    mail = next(a for a in pending(run) if a.mode == Approval.Mode.DEFER)
    decide(mail, "rejected", note=NOTE, feedback=FEEDBACK)
    assert execute_deferred(mail.tool_call_id) == "rejected"


def assert_feedback_follows_the_rejection(request: dict[str, Any]) -> None:
    update, feedback, *_ = told_after_update(request)
    call, outcome = update["content"].removeprefix(UPDATE).split(" → ", 1)
    assert (call, json.loads(outcome)) == ("send_email (call_mail)", outputs.rejected("send_email", NOTE))
    assert feedback == {"role": "user", "content": FEEDBACK}  # the note went with the rejection, the feedback alone
    assert feedback_given(request) == 1


def test_it_gives_the_model_the_feedback_of_a_deferred_call_rejected_after_its_turn_settled(
    db, agent_config, fake_openai
):
    agent_config(CONFIG.format(base_url=fake_openai.base_url))

    def respond(body: dict[str, Any]) -> Reply:
        """Turn 1: the email alone (deferred, the run goes on); 2: a refund (it pauses); 3: revise; then answer."""
        replies = [[EMAIL], [REFUND], [TO_CAROL]]
        told = len(tool_messages(body))
        return Reply(tool_calls=replies[told]) if told < len(replies) else Reply(content="done")

    fake_openai.script(respond)
    run = start("email bob, then refund", agent="ops")
    assert run.status == Run.Status.SUSPENDED  # on the refund, the email's turn long settled
    reject_the_email(run)
    decide(next(a for a in pending(run) if a.tool == "refund_request"), "approved", auto_resume=False)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    _, _, revising, answering = fake_openai.requests
    assert_feedback_follows_the_rejection(revising)
    assert feedback_given(answering) == 1  # in the history since, never told again
    assert Message.objects.filter(run=run, role=Message.Role.USER, tool_call_id="call_mail").count() == 1


def test_it_gives_the_feedback_of_a_deferred_call_after_its_rejection_when_its_turn_also_paused(
    db, agent_config, fake_openai
):
    agent_config(CONFIG.format(base_url=fake_openai.base_url))

    def respond(body: dict[str, Any]) -> Reply:
        """Turn 1: the email (deferred) and a refund (suspend) together; then answer."""
        return Reply(content="done") if tool_messages(body) else Reply(tool_calls=[EMAIL, REFUND])

    fake_openai.script(respond)
    run = start("email bob and refund", agent="ops")
    assert run.status == Run.Status.SUSPENDED
    reject_the_email(run)
    decide(next(a for a in pending(run) if a.tool == "refund_request"), "approved", auto_resume=False)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    _, answering = fake_openai.requests
    assert_feedback_follows_the_rejection(answering)
    assert Message.objects.filter(run=run, role=Message.Role.USER, tool_call_id="call_mail").count() == 1


def test_it_holds_the_feedback_of_a_deferred_call_until_its_rejection_is_told(db, agent_config, fake_openai):
    agent_config(CONFIG.format(base_url=fake_openai.base_url))

    def respond(body: dict[str, Any]) -> Reply:
        """Turn 1: the email and a refund; turn 2: a second refund (it pauses again); then answer."""
        told = len(tool_messages(body))
        if told == 0:
            return Reply(tool_calls=[EMAIL, REFUND])
        if told == 2:
            return Reply(tool_calls=[("call_refund_2", "refund_request", REFUND[2])])
        return Reply(content="done")

    fake_openai.script(respond)
    run = start("email bob and refund twice", agent="ops")
    mail = next(a for a in pending(run) if a.mode == Approval.Mode.DEFER)
    decide(mail, "rejected", note=NOTE, feedback=FEEDBACK)  # its rejection is not recorded yet
    decide(next(a for a in pending(run) if a.tool == "refund_request"), "approved", auto_resume=False)
    run = resume(run)
    assert run.status == Run.Status.SUSPENDED  # on the second refund
    assert execute_deferred(mail.tool_call_id) == "rejected"
    decide(pending(run)[0], "approved", auto_resume=False)
    run = resume(run)

    assert run.status == Run.Status.COMPLETED
    _, second, third = fake_openai.requests
    assert feedback_given(second) == 0  # not before the model knows the email was rejected
    assert_feedback_follows_the_rejection(third)
