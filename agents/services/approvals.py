"""Decisions on approvals; the same function serves the web, the API and the CLI."""

from __future__ import annotations

import json
import threading
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import Field, Model
from django.utils import timezone

from agents import events, notify, queue, sql, text
from agents.models import Approval, AuditEntry, Grant, Run, RunEvent, ToolCall, Vote, arguments_digest
from agents.policy.config import ConfigError, ToolPolicy, get_policy
from agents.policy.rules import CallFacts, GrantMatch, Verdict, denied, evaluate
from agents.services import eligibility, grants, runs
from agents.services.audit import CHAIN_LOCK, audit_append
from agents.services.errors import (
    AlreadyDecided,
    DigestMismatch,
    InvalidInput,
    NotFound,
    NotPermitted,
    ServiceError,
    WrongState,
    unsafe_text_refused,
)
from agents.sql.chain import values_of
from agents.tools import InvalidArguments, ToolError, registry

DECISIONS = (Approval.Status.APPROVED, Approval.Status.REJECTED)
MAX_TEXT_CHARS = 10_000
APPROVAL_ID_CHARS = cast(int, Approval._meta.get_field("id").max_length)
SHORT_DIGEST_CHARS = 12  # what pages and `approvals show` print of a digest


@dataclass(frozen=True)
class Decision:
    approval: Approval
    outcome: str  # AuditEntry.Outcome: decided, voted (the quorum is not reached yet) or idempotent
    resume_enqueued: bool = False
    grant: Grant | None = None  # the standing grant this decision created (`remember`)
    votes: list[Vote] | None = None  # the approval's votes when known without a read (None: read them)


@dataclass(frozen=True)
class Attempt:
    """Who asks for a decision, and from where; identity comes from authentication."""

    actor: str
    source: str  # AuditEntry.Source
    origin: str = ""
    on_behalf_of: str = ""
    # The authenticated user who acts, when the entry point holds them: judged as loaded, not read again.
    user: Any = field(default=None, compare=False, repr=False)

    @property
    def decider(self) -> str:
        return self.on_behalf_of or self.actor

    @property
    def decider_user(self) -> Any:
        """Return the deciding user when the entry point authenticated them (not a relayed name), or None."""
        return None if self.on_behalf_of else self.user


@dataclass(frozen=True)
class _Ask:
    """What one decision request carries, once validated."""

    decision: str
    attempt: Attempt
    note: str
    feedback: str
    arguments: dict[str, Any] | None
    payload: dict[str, Any] | None
    auto_resume: bool | None


def approval_decide(
    *,
    approval_id: str,
    decision: str,
    attempt: Attempt,
    note: str = "",
    feedback: str = "",
    arguments: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
    auto_resume: bool | None = None,
    expect_digest: str = "",
    remember: grants.Remember | None = None,
) -> Decision:
    """Vote on a pending approval; a rejection, or the quorum's last approval, decides it (invariant 3).

    1. Under the run's and the approval's row locks, read in one statement: validate the
       request and who asks, and refuse if the arguments are no longer those the reviewer
       saw (`expect_digest`). A refusal is audited once its transaction is rolled back: it
       changes nothing else.
    2. Still under the locks: record the vote, bound to the digest of
       the arguments it approves (an edit makes them the current ones); a rejection, or
       `quorum` distinct approvals of the current digest, compare-and-sets pending →
       decision with the tool call, audit row and event, in one transaction.
    3. On commit, enqueue the resume (the step's last suspend approval, auto_resume on) or
       the execution of a deferred call.
    Repeating the same vote is idempotent; a different decision after the end raises AlreadyDecided.
    With `remember`, the decision also becomes a standing grant, in the same transaction; it
    is refused up front (NotPermitted, audited) unless the reviewer could have decided alone.
    An approval (a vote too) of arguments a deny rule of the policy as it stands now matches
    is refused (NotPermitted, audited), whenever the call paused: a rejection is always taken.
    """
    if not _may_exist(approval_id):
        _audit_refusal(approval_id, attempt, decision, AuditEntry.Outcome.NOT_FOUND, {})
        raise _not_found(approval_id)
    result, approval = None, None
    fire_overdue = True
    while True:
        try:
            with _one_writer(), transaction.atomic():
                approval = sql.approval_for_decision(approval_id)  # the run's row lock, then the approval's
                if approval is None:
                    raise _Refused(AuditEntry.Outcome.NOT_FOUND, {}, _not_found(approval_id))
                if fire_overdue and overdue(approval):
                    raise _Overdue
                arguments = _validated(approval, decision, attempt, note, feedback, arguments, payload)
                _check_permitted(approval, decision, attempt, remember)
                if auto_resume:
                    _check_resume_permitted(approval, attempt)
                if approval.status == Approval.Status.PENDING:
                    _check_digest(approval, expect_digest)
                    if decision == Approval.Status.APPROVED:
                        _check_policy_permits(approval, arguments)
                    ask = _Ask(decision, attempt, note, feedback, arguments, payload, auto_resume)
                    result = _vote(approval, ask)
                    if remember is not None and result.outcome == AuditEntry.Outcome.DECIDED:
                        grant = grants.grant_create(
                            approval=result.approval,
                            decision=decision,
                            creator=attempt.decider,
                            remember=remember,
                            source=attempt.source,
                        )
                        result = replace(result, grant=grant)
        except _Overdue:
            # The deadline passed before this decision and its task has not run yet (a busy or
            # restarted worker): its outcome comes first, as the policy said, and the decision
            # then meets the approval as that outcome left it (expired, approved, escalated).
            _fire_deadline(approval_id)
            fire_overdue = False
            continue
        except _Refused as refused:
            # Audited once the decision's transaction is rolled back: a refusal changes nothing else.
            _audit_refusal(approval_id, attempt, decision, refused.outcome, refused.detail, approval)
            raise refused.error from None
        break
    if result is not None:
        return result
    return _refuse_or_repeat(approval_id, decision, attempt, _Words(note, feedback, payload, remember), arguments)


class _Overdue(Exception):
    """The approval is pending past its deadline: the deadline's outcome comes before a decision."""


def overdue(approval: Approval) -> bool:
    """Return whether a pending approval's deadline has passed (its task may not have fired yet)."""
    return (
        approval.status == Approval.Status.PENDING
        and approval.expires_at is not None
        and approval.expires_at <= timezone.now()
    )


def _fire_deadline(approval_id: str) -> None:
    from agents.services.deadlines import approval_deadline_fire  # deadlines builds on this module

    approval_deadline_fire(approval_id=approval_id)


class PolicyRefusal(Exception):
    """An approval the policy as it stands refuses: what to audit (`detail`), and the error its caller gets."""

    def __init__(self, detail: dict[str, Any], error: ServiceError) -> None:
        super().__init__(error.message)
        self.detail, self.error = detail, error


class _Refused(Exception):
    """A decision refused under the locks: what to audit, and the error its caller gets."""

    def __init__(self, outcome: str, detail: dict[str, Any], error: ServiceError) -> None:
        super().__init__(error.message)
        self.outcome, self.detail, self.error = outcome, detail, error


def _same_digest(expected: str, current: str) -> bool:
    """Accept the whole digest or the short one pages print (12 hex digits or more)."""
    expected = expected.strip().lower()
    return len(expected) >= SHORT_DIGEST_CHARS and current.startswith(expected)


def _check_permitted(approval: Approval, decision: str, attempt: Attempt, remember: grants.Remember | None) -> None:
    reason = eligibility.refusal_for_name(attempt.decider, approval, user=attempt.decider_user)
    if reason is None and attempt.on_behalf_of:
        reason = eligibility.refusal_of_relayer(attempt.actor, attempt.on_behalf_of, approval)
    if reason is not None:
        raise _Refused(AuditEntry.Outcome.NOT_PERMITTED, {"error": reason}, NotPermitted(reason, field="decided_by"))
    if remember is None:
        return
    # Refuse the whole decision when it cannot be remembered: nobody may believe a grant exists that does not.
    if attempt.on_behalf_of:
        # A grant decides later calls as its author alone (four eyes are checked against that author):
        # one relayed in someone else's name would let the relayer decide them, their own runs' too.
        reason = "a decision relayed in someone else's name: they remember it themselves"
    else:
        reason = grants.refusal(approval=approval, decision=decision, decider=attempt.decider)
    if reason is not None:
        message = f"this decision cannot be remembered: {reason}"
        detail = {"error": message, "remember": {"scope": remember.scope, "for_seconds": remember.seconds}}
        raise _Refused(AuditEntry.Outcome.NOT_PERMITTED, detail, NotPermitted(message, field="remember"))


def _check_resume_permitted(approval: Approval, attempt: Attempt) -> None:
    """Refuse `auto_resume: true` on a run its creator drives, from anyone else: a resume would take it from them."""
    reason = runs.resume_refusal(approval.run, attempt)
    if reason is not None:
        raise _Refused(AuditEntry.Outcome.NOT_PERMITTED, {"error": reason}, NotPermitted(reason, field="auto_resume"))


def _check_digest(approval: Approval, expected: str) -> None:
    """Refuse a decision on arguments other than those the reviewer saw (`expect_digest`)."""
    current = approval.digest
    if not expected or _same_digest(expected, current):
        return
    message = f"the arguments changed since you saw them (you saw {expected[:12]}, they are now {current[:12]})"
    detail = {"error": message, "expect_digest": expected, "arguments_digest": current}
    error = DigestMismatch(message, arguments_digest=current, approval=approval)
    raise _Refused(AuditEntry.Outcome.DIGEST_MISMATCH, detail, error)


def _vote(approval: Approval, ask: _Ask) -> Decision:
    """Record one vote on the locked, pending approval; decide it when the vote is decisive."""
    edited = ask.arguments is not None and arguments_digest(ask.arguments) != approval.digest
    if edited:
        # An edit is its author's approval of new arguments: approvals of the old ones stop counting.
        approval.arguments, approval.arguments_digest = ask.arguments, arguments_digest(ask.arguments)
    vote = Vote(
        approval=approval,
        voter=_fit(ask.attempt.decider, Vote, "voter"),
        arguments_digest=approval.digest,
        decision=ask.decision,
        arguments=ask.arguments if edited else None,
        note=ask.note,
        payload=ask.payload,
        source=_fit(ask.attempt.source, Vote, "source"),
        origin=_fit(ask.attempt.origin, Vote, "origin"),
        policy_version=approval.policy_version,
        created_at=timezone.now(),
    )
    if approval.quorum == 1:
        # Fixed when the approval opened: any earlier vote decided it, so this pending one has
        # none to repeat, and this vote is all the quorum needs; it is written with the decision.
        return _conclude(approval, ask, vote=vote)
    if edited:
        Approval.objects.filter(pk=approval.pk).update(
            arguments=approval.arguments, arguments_digest=approval.arguments_digest
        )
    # The approval's row lock serializes its votes: a plain check then insert cannot race here
    # (the unique constraint would still refuse a double).
    key = {"voter": vote.voter, "arguments_digest": vote.arguments_digest}
    same = Vote.objects.filter(approval=approval, decision=ask.decision, **key).first()
    if same is None:
        vote.save(force_insert=True)
    elif not edited and _is_last_vote(approval, same) and ask.note in ("", same.note) and ask.payload == same.payload:
        # (An edit back to arguments this voter approved before changed them: a vote to audit and announce.)
        detail = {"note": ask.note, "arguments_digest": approval.digest, "tally": approval.tally}
        _audit(approval, ask.attempt, action=ask.decision, outcome=AuditEntry.Outcome.IDEMPOTENT, detail=detail)
        return Decision(approval=approval, outcome=AuditEntry.Outcome.IDEMPOTENT)
    else:
        # The same vote again after voting other arguments, or with new words (a note, an answer):
        # it is this voter's vote now (one row per voter, digest and decision; the audit keeps every attempt).
        fields = {
            "note": vote.note,
            "payload": vote.payload,
            "source": vote.source,
            "origin": vote.origin,
            "created_at": vote.created_at,
        }
        Vote.objects.filter(pk=same.pk).update(policy_version=vote.policy_version, **fields)
    voters = approval.counted_voters  # only voters who may still decide (eligibility.counted_voters)
    if ask.decision == Approval.Status.APPROVED and len(voters) < approval.quorum:
        _announce_vote(approval, ask, edited, voters)
        return Decision(approval=approval, outcome=AuditEntry.Outcome.VOTED)
    return _conclude(approval, ask, voters=voters)


def _conclude(approval: Approval, ask: _Ask, *, vote: Vote | None = None, voters: list[str] | None = None) -> Decision:
    """Decide the locked, pending approval: it, its call, the vote that decided it (if new) and the event, in one write.

    One statement on PostgreSQL (agents.sql.chain), which also takes the audit chain's lock;
    the audit entry follows, and the commit. `voters`: whose approvals counted, when the vote read them.
    """
    fields = {
        "status": ask.decision,
        "decided_by": _fit(ask.attempt.decider, Approval, "decided_by"),
        "decided_at": timezone.now(),
        "note": ask.note,
        "feedback": ask.feedback if ask.decision == Approval.Status.REJECTED else "",  # blank otherwise: refused
        "arguments": approval.arguments,
        "arguments_digest": approval.arguments_digest,
        "payload": ask.payload,
        "resume_by_caller": ask.auto_resume is False,
    }
    for name, value in fields.items():
        setattr(approval, name, value)
    chain = sql.decision(run_id=approval.run_id, approval_id=approval.pk, audit_lock=CHAIN_LOCK)
    chain.update(Approval, approval.pk, fields, where={"status": Approval.Status.PENDING})
    call = {"status": ask.decision}
    chain.update(ToolCall, approval.tool_call_id, call, where={"status": ToolCall.Status.AWAITING_APPROVAL})
    if vote is not None:
        chain.insert(Vote, [values_of(vote)])
    push = events.record_in(chain, run_id=approval.run_id, items=[_decided_event(approval)])
    result = chain.run()
    assert result is not None, "the run is locked by the decision: its row is there"
    push(result)
    head = result.head
    resume = _unblock(approval, ask.auto_resume, head["status"], head["auto_resume"], head["others"])
    # Last: the audit chain's lock is one for the whole database, held until the commit.
    detail = _detail(approval, voters)
    _audit(
        approval, ask.attempt, action=approval.status, outcome=AuditEntry.Outcome.DECIDED, detail=detail, locked=True
    )
    notify.announce("approval.decided", approval.id)
    votes = [vote] if vote is not None else None
    return Decision(approval=approval, outcome=AuditEntry.Outcome.DECIDED, resume_enqueued=resume, votes=votes)


def _announce_vote(approval: Approval, ask: _Ask, edited: bool, voters: list[str]) -> None:
    """Audit a vote that leaves the quorum unreached, and tell viewers (cards show the tally)."""
    detail = {**_detail(approval, voters), "note": ask.note, "tally": approval.tally_of(voters)}
    if ask.payload is not None:  # a question's answer: the tool gets the last one, the audit keeps each
        detail["payload"] = ask.payload
    if not edited:
        detail.pop("arguments_diff", None)  # an earlier voter's edit, already audited with their vote
    _audit(approval, ask.attempt, action=ask.decision, outcome=AuditEntry.Outcome.VOTED, detail=detail)
    data = {
        "approval_id": approval.id,
        "tool": approval.tool,
        "voter": ask.attempt.decider,
        "tally": approval.tally_of(voters),
        "arguments_digest": approval.digest,
        "edited": edited,
    }
    events.publish(run_id=approval.run_id, type=RunEvent.Type.APPROVAL_VOTED, data=data)


def _announce_and_unblock(approval: Approval, auto_resume: bool | None) -> bool:
    """Publish the decision and enqueue what it makes possible; return whether a resume was enqueued.

    The event's seq is reserved with the run's status read under the run's row lock, so a
    driver suspending the run at this moment is seen either before or after, never half.
    """
    seq, run_status, run_auto_resume, others_pending = sql.run_reserve_events(
        run_id=approval.run_id, count=1, columns=("status", "auto_resume"), pending_suspend=True
    )
    events.record(run_id=approval.run_id, last_seq=seq, items=[_decided_event(approval)])
    return _unblock(approval, auto_resume, run_status, run_auto_resume, others_pending)


def _decided_event(approval: Approval) -> tuple[str, dict[str, Any]]:
    data = {
        "approval_id": approval.id,
        "tool": approval.tool,
        "decision": approval.status,
        "decided_by": approval.decided_by,
        "note": approval.note,
        "edited": approval.arguments is not None,
    }
    if approval.arguments is not None:
        data["arguments"] = approval.arguments  # what runs, shown wherever the decision is
    return RunEvent.Type.APPROVAL_DECIDED, data


def _unblock(
    approval: Approval, auto_resume: bool | None, run_status: str, run_auto_resume: bool, others_pending: bool
) -> bool:
    """Enqueue, on commit, what a decision makes possible; return whether a resume was enqueued."""
    if approval.mode == Approval.Mode.DEFER:
        queue.deferred_on_commit(approval.tool_call_id)
        return False
    wanted = bool(run_auto_resume) if auto_resume is None else auto_resume
    if not wanted or run_status != Run.Status.SUSPENDED:
        return False
    if others_pending:
        return False  # the step's other approvals still wait (this one is decided already)
    queue.drive_on_commit(approval.run_id)
    return True


def _may_exist(approval_id: str) -> bool:
    """Return whether an approval could have this id; one no approval can have (NUL, too long) is not looked up."""
    return text.problem(approval_id) is None and len(approval_id) <= APPROVAL_ID_CHARS


def _not_found(approval_id: str) -> NotFound:
    return NotFound(f"no approval {text.repair(approval_id)[:APPROVAL_ID_CHARS]}")


def _is_last_vote(approval: Approval, vote: Vote) -> bool:
    """Return whether `vote` is its voter's latest on this approval (a later one replaced it otherwise)."""
    last = approval.votes.filter(voter=vote.voter).order_by("-created_at", "-id").values_list("pk", flat=True)
    return last.first() == vote.pk


def _check_policy_permits(approval: Approval, arguments: dict[str, Any] | None) -> None:
    """Refuse an approval that the policy as it stands now would not let run.

    Who may decide a call, and how many, came from the rules the model's arguments matched
    when it paused (the approval keeps them, with the policy's version). What the policy says
    of the call now is judged again at each approval, a vote included, of the locked approval:

    - an edit, in full (`_check_edit_permitted`): deny rules, remembered rejections, and an ask
      of more (or other) people than this approval asks;
    - the arguments it stands on (the model's, or an earlier vote's edit): deny rules only. A
      deny rule added since the call paused refuses it, for every entry point (web, API, CLI,
      Slack, mailed links, bulk, Run now); the reviewer may still reject it.

    An unedited approval is not held to an ask rule that now wants more approvals or other
    approvers: it was opened, and its votes cast, under the rules of its policy version, and
    re-deciding who counts halfway would change a quorum people already voted in. An operator
    who must stop waiting calls adds a deny rule (or cancels their runs). Nor is it held to a
    remembered rejection: a grant stands in for a reviewer on calls nobody was asked about, and
    here a reviewer decides this very call (looking one up would also cost a query a decision).
    """
    try:
        if arguments is not None and arguments_digest(arguments) != approval.digest:
            _check_edit_permitted(approval, arguments)
        else:
            _check_not_denied(approval)
    except ConfigError as exc:
        raise _unreadable_policy(exc) from None


def _unreadable_policy(exc: ConfigError) -> _Refused:
    """Return the refusal of an approval while the policy file cannot be read (a half-saved edit).

    A deny rule may be just what that edit adds: nothing is approved until the file reads
    again, as the clock approves nothing meanwhile (deadlines.approval_deadline_fire).
    """
    message = (
        "the policy file cannot be read, so whether it now denies this call cannot be checked: "
        "approve it once the file is fixed (a rejection is still taken)"
    )
    detail = {"error": message, "policy_error": str(exc)}
    return _Refused(AuditEntry.Outcome.NOT_PERMITTED, detail, NotPermitted(message, field="decision"))


def _check_not_denied(approval: Approval) -> None:
    """Refuse to approve arguments that a deny rule of the current policy matches.

    The policy file is read once per change (get_policy compares its mtime): a tool without a
    deny rule costs a dict lookup, one with deny rules an evaluation of those rules; neither
    reads the database (the approval's call and run were read with it, under its locks).
    Raises ConfigError when the file cannot be read.
    """
    verdict = denial_now(approval)
    if verdict is None:
        return
    message = (
        f"the policy now denies this call (rule {verdict.rule!r}: {verdict.reason}): "
        "it cannot be approved with these arguments, only rejected (or edited to arguments the policy lets through)"
    )
    detail = {
        "error": message,
        "rule": verdict.rule,
        "arguments_digest": approval.digest,
        "policy_version": verdict.policy_version,
        "asked_under": approval.policy_version,
    }
    raise _Refused(AuditEntry.Outcome.NOT_PERMITTED, detail, NotPermitted(message, field="arguments"))


def denial_now(approval: Approval) -> Verdict | None:
    """Return the deny verdict the current policy gives the approval's call on its current arguments, or None.

    Only deny rules count, and only they are evaluated (no grant is looked up: no query).
    They are the file's alone, an agent's own entry carries none (config._check_no_agent_rules),
    so a tool the file gives no deny rule costs a dict lookup. A rule that cannot be evaluated
    denies, as it would a new call. Raises ConfigError when the file cannot be read.
    """
    policy = get_policy()
    entry = policy.tool_overrides.get(approval.tool)
    if entry is None or not any(rule.action == "deny" for rule in entry.rules):
        return None
    facts, agent = grants.call_of(approval, approval.current_arguments or {})
    return denied(policy, facts, agent=agent)


def _check_edit_permitted(approval: Approval, arguments: dict[str, Any]) -> None:
    """Refuse an edit the policy would not let this approval run: a deny rule, or an ask of more people.

    Who may decide a call, and how many, came from the rules the model's arguments matched
    when it paused. Edited arguments are judged again, so that an edit cannot carry a call past
    a rule that denies them, or past one that wants more approvals (or other approvers) than
    this approval was opened for. Asking less (an allow rule) changes nothing: the approval
    still asks what it asked.
    """
    if arguments_digest(arguments) == approval.digest:
        return  # not an edit: the arguments this approval was opened for (or last edited to)
    verdict = verdict_now(approval, arguments)
    if verdict.action == "deny":
        message = f"the policy refuses these arguments: {verdict.reason}"
    elif verdict.action == "ask" and not _asks_at_least(approval, verdict):
        message = (
            f"these arguments need {_who(verdict.quorum, verdict.approvers)} (rule {verdict.rule or 'of the tool'}), "
            f"and this approval asks {_who(approval.quorum, approval.approvers)}: reject it with feedback instead, "
            "so that the model proposes them and the policy asks the right people"
        )
    else:
        return
    detail = {"error": message, "arguments": arguments, "rule": verdict.rule}
    raise _Refused(AuditEntry.Outcome.NOT_PERMITTED, detail, NotPermitted(message, field="arguments"))


def verdict_now(approval: Approval, arguments: dict[str, Any]) -> Verdict:
    """Return what the policy says now of the approval's call with these arguments.

    Of the grants, only remembered rejections count: like deny rules they come before any
    person is asked, so neither an edit nor a deadline carries a call onto arguments one of
    them refuses. Raises ConfigError when the file cannot be read.
    """
    facts, agent = grants.call_of(approval, arguments)
    return evaluate(get_policy(), facts, agent=agent, grant_lookup=_remembered_rejection)


def _remembered_rejection(facts: CallFacts, tool: ToolPolicy) -> GrantMatch | None:
    """Return the live remembered rejection of these arguments, if any (grant_match looks at rejections first)."""
    match = grants.grant_match(facts, tool)
    return match if match is not None and match.action == "deny" else None


def _asks_at_least(approval: Approval, verdict: Verdict) -> bool:
    """Return whether the approval already asks at least what the verdict asks: quorum, approvers, four eyes."""
    if verdict.quorum > approval.quorum or (verdict.four_eyes and not approval.four_eyes):
        return False
    if not verdict.approvers:
        return True  # any reviewer may decide
    return bool(approval.approvers) and set(approval.approvers) <= set(verdict.approvers)


def _who(quorum: int, approvers: Any) -> str:
    whom = ", ".join(approvers) if approvers else "any reviewer"
    return f"{quorum} approval{'s' if quorum > 1 else ''} from {whom}"


def _find(approval_id: str) -> Approval | None:
    return Approval.objects.filter(pk=approval_id).first() if _may_exist(approval_id) else None


def _validated(
    approval: Approval,
    decision: str,
    attempt: Attempt,
    note: str,
    feedback: str,
    arguments: dict[str, Any] | None,
    payload: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """Return the edited arguments, strictly validated against the tool's schema; refuse a malformed request."""
    try:
        if decision not in DECISIONS:
            raise InvalidInput(f"decision must be 'approved' or 'rejected', not {decision!r}", field="decision")
        if not attempt.actor.strip():
            raise InvalidInput("who decides is required", field="decided_by")
        _check_texts(decision, note=note, feedback=feedback, arguments=arguments, payload=payload)
        if decision == Approval.Status.APPROVED:
            _check_answer(approval, payload)
        if arguments is None:
            return None
        if decision != Approval.Status.APPROVED:
            raise InvalidInput("edited arguments only go with an approval", field="arguments")
        return _validated_edit(approval, arguments)
    except InvalidInput as exc:
        detail = {"error": exc.message, "arguments": arguments}  # with what the refused request carried
        raise _Refused(AuditEntry.Outcome.INVALID_ARGUMENTS, detail, exc) from None


def _check_texts(decision: str, **values: Any) -> None:
    """Refuse a reviewer's text that cannot be stored, and feedback that would be dropped."""
    for name, value in values.items():
        with unsafe_text_refused():
            text.require_clean(value, field=name)
    if len(values["note"]) > MAX_TEXT_CHARS or len(values["feedback"]) > MAX_TEXT_CHARS:
        raise InvalidInput(f"note and feedback are limited to {MAX_TEXT_CHARS} characters", field="note")
    if values["payload"] is not None and not isinstance(values["payload"], dict):
        raise InvalidInput("payload must be a JSON object", field="payload")
    if decision == Approval.Status.APPROVED and values["feedback"].strip():
        # Feedback is a message for the model to revise with: it only exists with a rejection.
        raise InvalidInput(
            "feedback goes with a rejection (the model revises with it); to approve, move it to the note",
            field="feedback",
        )


def _check_answer(approval: Approval, payload: dict[str, Any] | None) -> None:
    """Refuse to approve a question a tool asked without the reviewer's answer: never invent one."""
    if approval.request is None:
        return
    if not payload:
        raise InvalidInput(f"{approval.tool} asked a question: approve it with an answer", field="payload")
    if "answer" in approval.request and not str(payload.get("answer") or "").strip():
        raise InvalidInput(f"{approval.tool} asked a question: the answer is empty", field="payload.answer")


def _validated_edit(approval: Approval, arguments: dict[str, Any]) -> dict[str, Any]:
    """Validate a reviewer's edit strictly: no coercion (true is not 1, "1500" is not 1500).

    An external agent's own tool has no schema here: its edit is the JSON object the claim hands out.
    """
    tool = registry.get(approval.tool)
    if tool is None and approval.run.kind == Run.Kind.EXTERNAL:
        return arguments
    if tool is None:
        raise InvalidInput(f"tool {approval.tool!r} is no longer registered", field="arguments")
    try:
        validated = tool.validate(arguments, strict=True)
        tool.check_arguments(validated)
    except InvalidArguments as exc:
        raise InvalidInput(
            f"arguments: {exc.message}", field=f"arguments.{exc.field}" if exc.field else "arguments"
        ) from None
    except ToolError as exc:
        raise InvalidInput(f"arguments: {exc.message}", field="arguments") from None
    return validated


@dataclass(frozen=True)
class _Words:
    """What a reviewer wrote with a decision: a repeat that says something new is not the same decision."""

    note: str
    feedback: str
    payload: dict[str, Any] | None
    remember: grants.Remember | None = None  # a grant is made only with the decision that decides

    def new_to(self, approval: Approval) -> list[str]:
        """Return which of these words the decided approval does not already hold."""
        new = [
            name for name in ("note", "feedback") if getattr(self, name).strip() not in ("", getattr(approval, name))
        ]
        if self.payload is not None and self.payload != approval.payload:
            new.append("answer" if approval.request is not None else "payload")
        if self.remember is not None:
            new.append("request to remember")
        return new

    def detail(self) -> dict[str, Any]:
        detail: dict[str, Any] = {"note": self.note}
        if self.feedback:
            detail["feedback"] = self.feedback
        if self.payload is not None:
            detail["payload"] = self.payload
        if self.remember is not None:
            detail["remember"] = {"scope": self.remember.scope, "for_seconds": self.remember.seconds}
        return detail


def _refuse_or_repeat(
    approval_id: str, decision: str, attempt: Attempt, words: _Words, arguments: dict[str, Any] | None
) -> Decision:
    """Answer a decision on an approval decided already: the same one again is idempotent, any other is refused.

    A repeat that carries words the decision does not hold (another note, feedback, answer)
    is refused too: answering it "idempotent" would tell its author their words were taken.
    Every attempt is audited with what it carried.
    """
    approval = Approval.objects.get(pk=approval_id)
    unsaid = words.new_to(approval)
    # Arguments equal to those that stand (the proposal, or the edit that ran) are no edit: a retry, not a change.
    same = approval.status == decision and (arguments is None or arguments_digest(arguments) == approval.digest)
    if same and not unsaid:
        _audit(approval, attempt, action=decision, outcome=AuditEntry.Outcome.IDEMPOTENT, detail=words.detail())
        return Decision(approval=approval, outcome=AuditEntry.Outcome.IDEMPOTENT)
    outcome = (
        AuditEntry.Outcome.EXPIRED if approval.status == Approval.Status.EXPIRED else AuditEntry.Outcome.ALREADY_DECIDED
    )
    detail = {**words.detail(), "existing": approval.status}
    _audit(approval, attempt, action=decision, outcome=outcome, detail=detail)
    when = f" at {approval.decided_at:%Y-%m-%d %H:%M:%S} UTC" if approval.decided_at else ""
    message = f"approval {approval.id} was already {approval.status} by {approval.decided_by or 'the system'}{when}"
    if same:
        message += f"; your {' and '.join(unsaid)} {'was' if len(unsaid) == 1 else 'were'} not recorded with it"
    error = WrongState if outcome == AuditEntry.Outcome.EXPIRED else AlreadyDecided
    raise error(message, approval=approval)


def approval_refuse(*, approval_id: str, decision: str, attempt: Attempt, outcome: str, reason: str) -> None:
    """Audit a decision attempt that its caller refused before deciding (not permitted, unreadable)."""
    approval = _find(approval_id)
    _audit_refusal(approval_id, attempt, decision, outcome, {"error": reason}, approval=approval)


def approval_expire(*, approval: Approval, actor: str, reason: str, resume: bool = True) -> bool:
    """Expire a pending approval (timeout, cancelled run); the model reads it as a rejection."""
    with transaction.atomic():
        _lock_run(approval.run_id)  # the order approval_decide and run_cancel take locks in: no deadlock
        won = Approval.objects.filter(pk=approval.pk, status=Approval.Status.PENDING).update(
            status=Approval.Status.EXPIRED, decided_by=actor, decided_at=timezone.now(), note=reason
        )
        if not won:
            return False
        approval.refresh_from_db()
        ToolCall.objects.filter(pk=approval.tool_call_id, status=ToolCall.Status.AWAITING_APPROVAL).update(
            status=ToolCall.Status.REJECTED
        )
        attempt = Attempt(actor=actor, source=AuditEntry.Source.SYSTEM)
        _audit(approval, attempt, action="expired", outcome=AuditEntry.Outcome.DECIDED, detail={"note": reason})
        _announce_and_unblock(approval, None if resume else False)
        notify.announce("approval.expired", approval.id)
    return True


def approval_expire_due() -> int:
    """Give every pending approval past its deadline its outcome (agents.services.deadlines); return how many."""
    from agents.services.deadlines import approval_deadlines_due

    return approval_deadlines_due()


def approval_approve_as(*, approval: Approval, actor: str, note: str, attempt: Attempt | None = None) -> bool:
    """Approve a pending approval without votes: its deadline (or a schedule) says so, or a reviewer runs it now.

    The caller holds the run's row lock; the compare-and-set in _conclude makes a second call a no-op.
    A person's approval (with `attempt`: Run now) is refused, as any approval is, when a deny
    rule of the policy now matches the call (PolicyRefusal, for the caller to audit once its
    transaction is rolled back); the clock's callers judge the policy themselves, and expire such a call.
    """
    locked = Approval.objects.select_for_update().select_related("tool_call", "run").get(pk=approval.pk)
    if locked.status != Approval.Status.PENDING:
        return False
    if attempt is not None:
        try:
            _check_policy_permits(locked, None)
        except _Refused as refused:
            raise PolicyRefusal(refused.detail, refused.error) from None
    attempt = attempt or Attempt(actor=actor, source=AuditEntry.Source.SYSTEM)
    _conclude(locked, _Ask(Approval.Status.APPROVED, attempt, note, "", None, locked.payload, None))
    return True


def _detail(approval: Approval, voters: list[str] | None = None) -> dict[str, Any]:
    """Return what the audit records of a decision or vote; `voters`: whose approvals count, when read already."""
    detail: dict[str, Any] = {
        "note": approval.note,
        "arguments_digest": approval.digest,
        "policy_version": approval.policy_version,
    }
    if approval.quorum > 1:
        detail["votes"] = approval.counted_voters if voters is None else voters
    if approval.feedback:
        detail["feedback"] = approval.feedback
    if approval.payload is not None:
        detail["payload"] = approval.payload
    if approval.arguments is not None:
        before = approval.tool_call.arguments or {}
        detail["arguments_diff"] = {
            key: [before.get(key), approval.arguments.get(key)]
            for key in sorted(set(before) | set(approval.arguments))
            if _json_differs(before, approval.arguments, key)
        }
    return detail


def _json_differs(before: dict[str, Any], after: dict[str, Any], key: str) -> bool:
    """Return whether an argument differs as JSON, as the digest tells: Python's == calls 1 and true equal,
    and a missing argument and a null one the same."""
    if (key in before) != (key in after):
        return True
    return key in before and json.dumps(before[key], sort_keys=True) != json.dumps(after[key], sort_keys=True)


def _audit(
    approval: Approval, attempt: Attempt, *, action: str, outcome: str, detail: dict[str, Any], locked: bool = False
) -> None:
    """Audit an attempt on a known approval; `locked`: this transaction holds the audit chain's lock already."""
    _audit_refusal(approval.pk, attempt, action, outcome, detail, approval=approval, locked=locked)


def _audit_refusal(
    approval_id: str,
    attempt: Attempt,
    decision: str,
    outcome: str,
    detail: dict[str, Any],
    approval: Approval | None = None,
    locked: bool = False,
) -> None:
    """Append an audit row; the approval may be unknown (a refused attempt on a bad id).

    Whatever a refused request carried is repaired and cut to its column, so refusing it
    can never fail: an attempt is audited however malformed it was.
    """
    audit_append(
        approval_id=approval_id,
        run_id=approval.run_id if approval else "",
        tool=approval.tool if approval else "",
        action=decision,
        actor=attempt.actor,
        on_behalf_of=attempt.on_behalf_of,
        source=attempt.source,
        origin=attempt.origin,
        outcome=outcome,
        detail=detail,
        chain_locked=locked,
    )


def audit_run(*, run_id: str, attempt: Attempt, action: str, detail: dict[str, Any], refused: bool = False) -> None:
    """Audit a change of a whole run (a cancel), or its refusal: who, from where, what."""
    audit_append(
        approval_id="",
        run_id=run_id,
        action=action,
        actor=attempt.actor,
        on_behalf_of=attempt.on_behalf_of,
        source=attempt.source,
        origin=attempt.origin,
        outcome=AuditEntry.Outcome.NOT_PERMITTED if refused else AuditEntry.Outcome.DECIDED,
        detail=detail,
    )


def _fit(value: str, model: type[Model], field: str) -> str:
    """Return text repaired and cut to the column's length."""
    column = cast("Field[Any, Any]", model._meta.get_field(field))  # a text column, not a relation
    return text.repair(value)[: column.max_length]


def _lock_run(run_id: str) -> None:
    """Lock the run's row until the transaction ends (SQLite serializes writing transactions anyway)."""
    if not connection.features.has_select_for_update:
        return  # SQLite: BEGIN IMMEDIATE already holds the database's one write lock
    list(Run.objects.select_for_update().filter(pk=run_id).values_list("pk", flat=True))


_sqlite_writer = threading.Lock()


def _one_writer() -> AbstractContextManager[object]:
    """On SQLite, let this process's threads take the write lock one after the other.

    SQLite admits one writing transaction; a thread that finds it taken polls with growing
    sleeps (up to 100 ms each), so decisions served side by side would wait far longer than
    the transaction ahead of them lasts. A lock of the process queues them instead (other
    processes still meet SQLite's own). PostgreSQL's row locks need no help. Inside a
    caller's transaction the write lock is already held: waiting here could only deadlock.
    """
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        return nullcontext()
    return _sqlite_writer
