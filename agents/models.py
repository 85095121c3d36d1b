"""The durable state of agent runs: the database is the only source of truth.

Every write goes through agents.services; these classes only describe the rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone


def arguments_digest(arguments: dict[str, Any] | None) -> str:
    """Return the sha256 of the arguments' canonical JSON: what a decision is bound to."""
    canonical = json.dumps(arguments or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # A lone surrogate (stored text is repaired, but be total) must not make a digest fail.
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUSPENDED = "suspended"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    class Kind(models.TextChoices):
        INTERNAL = "internal"  # an agent agentfast runs itself
        EXTERNAL = "external"  # a session of an agent running elsewhere, gated over POST /api/gate

    TERMINAL = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)

    id = models.CharField(primary_key=True, max_length=40, editable=False)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.INTERNAL)
    agent = models.CharField(max_length=100, db_index=True)
    # An agent defined for this run alone (keys of an agentfast.yaml `agents:` entry), or
    # None for the configured agent of that name.
    agent_config = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    input = models.TextField()
    auto_resume = models.BooleanField(default=True)
    created_by = models.CharField(max_length=150, blank=True)  # a username (four-eyes compares it)
    started_from = models.CharField(max_length=20, blank=True)  # api, cli, playground (empty: unknown)
    # Who drives the run now; a compare-and-set on lease_expires_at hands it out (invariant 5).
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    steps = models.PositiveIntegerField(default=0)
    last_event_seq = models.PositiveIntegerField(default=0)
    output = models.TextField(blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status", "updated_at"], name="run_status_updated"),
            # The runs page: newest first, all or by status; and the API's filters.
            models.Index(fields=["created_at"], name="run_created"),
            models.Index(fields=["status", "created_at"], name="run_status_created"),
            models.Index(fields=["created_by", "created_at"], name="run_created_by"),
            # The sweeper: suspended runs that resume by themselves (the stranded-run check's outer side).
            models.Index(
                fields=["id"], name="run_suspended_resumable", condition=models.Q(status="suspended", auto_resume=True)
            ),
            # External agents' sessions (the sweeper's look for their calls claimed long ago): an
            # internal run never enters it. Without it that look read every run (24 ms at 200,000).
            models.Index(fields=["id"], name="run_external", condition=models.Q(kind="external")),
            # On PostgreSQL the searches of runs, calls and approvals also have trigram indexes,
            # outside this state (SQLite has none): migrations 0030 and 0032.
        ]
        permissions = [("gate_external", "Can gate, claim and report its own external tool calls")]

    def __str__(self) -> str:
        return f"{self.id} ({self.agent}, {self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def account(self) -> str:
        """Return the authenticated account an external run's agent calls as ("" for a run agentfast drives)."""
        return self.created_by if self.kind == self.Kind.EXTERNAL else ""


class Message(models.Model):
    """One entry of the conversation; the ordered rows of a run are its checkpoint."""

    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"

    # No index of its own: message_run_seq starts with it (tests/agents/test_indexes.py).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="messages", db_index=False)
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="message_run_seq")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.role}"


class ToolCall(models.Model):
    class Status(models.TextChoices):
        PROPOSED = "proposed"  # low risk, not yet run
        AWAITING_APPROVAL = "awaiting_approval"
        APPROVED = "approved"  # decided, not yet run
        REJECTED = "rejected"
        RUNNING = "running"  # claimed: executed_at is set, no result yet
        SUCCEEDED = "succeeded"
        FAILED = "failed"  # the tool raised, or its arguments were invalid
        IN_DOUBT = "in_doubt"  # claimed by a worker that died before recording a result

    # No index of its own: toolcall_run_call starts with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tool_calls", db_index=False)
    call_id = models.CharField(max_length=100)
    # The assistant message seq that proposed this call: the calls of one step share it.
    step = models.PositiveIntegerField()
    name = models.CharField(max_length=100)
    arguments = models.JSONField(null=True, blank=True)  # as the model proposed them
    status = models.CharField(max_length=20, choices=Status.choices)
    hitl_mode = models.CharField(max_length=10, blank=True)  # "", suspend or defer
    executed_at = models.DateTimeField(null=True, blank=True)  # the exactly-once claim
    executed_arguments = models.JSONField(null=True, blank=True)  # what actually ran
    result = models.JSONField(null=True, blank=True)  # memoized tool output
    # A decided call whose tool asked to run later (run_at): it is not claimed before this time.
    not_before = models.DateTimeField(null=True, blank=True)
    # For deferred calls: when the model was told the outcome (None: not yet).
    reported_at = models.DateTimeField(null=True, blank=True)
    # For deferred calls: when the sweeper last sent the decided call's message again (None: never).
    resent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "step", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "call_id"], name="toolcall_run_call")]
        # The sweeper looks only at calls with no result yet: a few rows, however long the history.
        indexes = [
            models.Index(
                fields=["hitl_mode", "executed_at"], name="toolcall_open", condition=models.Q(result__isnull=True)
            ),
            models.Index(fields=["executed_at"], name="toolcall_open_claimed", condition=models.Q(result__isnull=True)),
            # The sweeper's stranded-run check starts from these: suspend calls decided and not yet run, the
            # few runs a resume is owed to, however many runs wait on a person.
            models.Index(
                fields=["run"],
                name="toolcall_decided_unrun",
                condition=models.Q(result__isnull=True, hitl_mode="suspend", status__in=["approved", "rejected"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.call_id} {self.name}"

    @property
    def in_doubt(self) -> bool:
        return self.status == self.Status.IN_DOUBT

    def held_until(self, now: datetime) -> datetime | None:
        """Return the time its tool asked for (run_at) while this decided call still waits for it; else None."""
        return self.not_before if self.not_before is not None and self.not_before > now else None

    @staticmethod
    def due(now: datetime) -> models.Q:
        """Return a filter of the calls not held (as held_until() says): no time of their tool's, or it has come."""
        return models.Q(not_before__isnull=True) | models.Q(not_before__lte=now)


DEADLINE = "deadline"  # who decided when a deadline approved (approvals' decided_by)
SCHEDULE = "schedule"  # who decided when a scheduled call's time came
RUN_NOW = "run now"  # the note of a scheduled call a reviewer ran before its time


class Approval(models.Model):
    class Mode(models.TextChoices):
        SUSPEND = "suspend"
        DEFER = "defer"

    class OnTimeout(models.TextChoices):
        REJECT = "reject"
        APPROVE = "approve"
        ESCALATE = "escalate"
        RUN = "run"  # a scheduled call: its time came, it runs (decided by "schedule")

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"

    # Derived, never random: appr_{run_id}_{call_id} (invariant 1).
    id = models.CharField(primary_key=True, max_length=200, editable=False)
    # No index of its own: approval_run_status starts with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals", db_index=False)
    tool_call = models.OneToOneField(ToolCall, on_delete=models.CASCADE, related_name="approval")
    tool = models.CharField(max_length=100, db_index=True)
    mode = models.CharField(max_length=10, choices=Mode.choices)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    # What a tool that asked for a decision itself (feedback_required) put in front of the human.
    request = models.JSONField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    feedback = models.TextField(blank=True)  # a user message for the model to revise with
    arguments = models.JSONField(null=True, blank=True)  # edited arguments, if any
    payload = models.JSONField(null=True, blank=True)  # the reviewer's answer to a custom tool
    # The decision said not to resume the run (auto_resume false): its decider resumes it, and
    # the sweeper, which resumes a decided run whose resume message was lost, leaves it to them.
    resume_by_caller = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    # The policy's time to decide, which an escalation gives its approvers anew (an extension
    # the first approvers got does not carry over).
    timeout_seconds = models.FloatField(null=True, blank=True)
    # What the deadline does (agents/services/deadlines.py): its outcome, whom an escalation adds
    # as approvers (once: escalated_at), and how often to remind while it waits.
    on_timeout = models.CharField(max_length=10, choices=OnTimeout.choices, default=OnTimeout.REJECT)
    escalate_to = models.JSONField(default=list, blank=True)
    remind_every_seconds = models.FloatField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    last_reminded_at = models.DateTimeField(null=True, blank=True)
    # What the policy (agentfast.yaml) asked for when the call paused: the rule that decided
    # (empty: the tool's own settings), who may decide (group names or "user:NAME"; empty:
    # any reviewer), how many distinct approvers, whether the run's creator is excluded,
    # and the version of the file that asked.
    rule = models.CharField(max_length=100, blank=True)
    approvers = models.JSONField(default=list, blank=True)
    quorum = models.PositiveSmallIntegerField(default=1)
    four_eyes = models.BooleanField(default=False)
    policy_version = models.CharField(max_length=64, blank=True)
    # The digest of the arguments a decision now approves (the edited ones once edited).
    arguments_digest = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status", "created_at"], name="approval_status_created"),
            models.Index(fields=["status", "tool", "created_at"], name="approval_status_tool"),
            # The API's list of every status, newest first, and its cursor's keyset.
            models.Index(fields=["created_at", "id"], name="approval_created"),
            # The inbox's order (nearest deadline, then longest waiting) read straight off the index, and
            # the sweeper's overdue deadlines (its prefix).
            models.Index(fields=["status", "expires_at", "created_at", "id"], name="approval_inbox_oldest"),
            # Insights: the decisions of the last 7, 30 or 90 days, not every decision ever made.
            models.Index(fields=["decided_at"], name="approval_decided"),
            # The sweeper: suspended runs whose last decision is past the grace period.
            models.Index(fields=["run", "status"], name="approval_run_status"),
            # The sweeper: which suspended runs still wait on someone (an anti-join on this small index).
            models.Index(
                fields=["run"], name="approval_pending_suspend", condition=models.Q(status="pending", mode="suspend")
            ),
            # The sweeper's reminders: the pending approvals that remind, not a scan of every pending one;
            # what it compares is in the index (PostgreSQL), so a tool with thousands of calls waiting
            # costs no read of their rows (an index-only scan: 100,000 in 36 ms here, against 60).
            models.Index(
                fields=["status", "created_at"],
                name="approval_reminding",
                condition=models.Q(remind_every_seconds__isnull=False),
                include=["id", "last_reminded_at", "remind_every_seconds", "on_timeout"],
            ),
        ]
        permissions = [
            ("decide_approval", "Can approve or reject tool calls"),
            ("decide_on_behalf", "Can record a decision in another person's name (a chat bot relaying)"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"

    @property
    def current_arguments(self) -> dict[str, Any] | None:
        """Return the arguments a decision now approves: the last edit, else the model's."""
        return self.arguments if self.arguments is not None else self.tool_call.arguments

    @property
    def digest(self) -> str:
        """Return the digest of the current arguments (computed for rows older than the column)."""
        return self.arguments_digest or arguments_digest(self.current_arguments)

    @property
    def short_digest(self) -> str:
        return self.digest[:12]

    # Whose approvals count, when a page of cards read them for all its cards at once (eligibility.mark).
    page_counted_voters: list[str] | None = None
    page_votes: list[Vote] | None = None  # the page's read of its votes, oldest first (eligibility.mark)

    @property
    def counted_voters(self) -> list[str]:
        """Return whose approvals count towards the quorum, in order: what the decision counts, and the cards show."""
        if self.page_counted_voters is not None:
            return self.page_counted_voters
        from agents.services import eligibility  # who may still decide is the services' to say; they read these models

        return eligibility.counted_voters(self, self.votes.order_by("created_at", "id"))

    def voters_counted(self, votes: Iterable[Vote]) -> list[str]:
        """Return the voters whose last vote (of `votes`, oldest first) approves the current arguments.

        A reviewer's later vote replaces their earlier one: someone who approved these arguments
        and then edited them to others no longer approves these, so editing back cannot pair
        their stale approval with a second reviewer's to reach a quorum of two.
        """
        last: dict[str, Vote] = {}
        for vote in votes:
            last.pop(vote.voter, None)  # re-inserted: the order is that of each voter's last vote
            last[vote.voter] = vote
        digest = self.digest
        return [
            voter
            for voter, vote in last.items()
            if vote.decision == self.Status.APPROVED and vote.arguments_digest == digest
        ]

    @property
    def waits_for(self) -> str:
        """Say whom the approval waits for: "finance, user:dan", or "any reviewer"."""
        return ", ".join(self.approvers) if self.approvers else "any reviewer"

    @property
    def decided_by_policy(self) -> bool:
        """Return whether a rule, a standing grant or a schedule's time decided the call: nobody was asked.

        "policy:…", "grant:…", or SCHEDULE (a schedule rule's time, or the time a tool asked
        to run at, came), or a reviewer's Run now on such a call (its time, come early: the
        press answers no question); not a person's decision otherwise, nor DEADLINE (a deadline
        stands for nobody answering).
        """
        if self.status == self.Status.PENDING:
            return False
        decided_by = self.decided_by
        ran_now = (
            self.status == self.Status.APPROVED
            and self.on_timeout == self.OnTimeout.RUN
            and self.request is None
            and self.note == RUN_NOW
        )
        return decided_by.startswith(("policy:", "grant:")) or decided_by == SCHEDULE or ran_now

    @property
    def answers_so_far(self) -> list[tuple[str, str]]:
        """Return each approver's answer to this pending question so far, oldest first: [(voter, answer as text)].

        With a quorum over 1 each approver answers; the next one reads what the others said.
        The answer is the payload's `answer`, or the whole payload (as JSON) when it has none.
        Empty, without a query, for anything else (a call, a decided question, a quorum of 1).
        """
        if self.request is None:
            return []
        answers: dict[str, str] = {}
        for vote in self._approving_so_far():
            if vote.payload is not None:
                answer = vote.payload.get("answer", vote.payload) if isinstance(vote.payload, dict) else vote.payload
                answers[vote.voter] = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
        return list(answers.items())

    @property
    def notes_so_far(self) -> list[tuple[str, str]]:
        """Return the note each approver gave with their approval so far, oldest first: [(voter, note)].

        The reviewer who completes the quorum reads why the others approved ("checked with
        finance") before adding theirs. Empty, without a query, when no quorum over 1 waits.
        """
        notes = {vote.voter: vote.note for vote in self._approving_so_far()}  # each voter's last vote
        return [(voter, note) for voter, note in notes.items() if note]

    def _approving_so_far(self) -> list[Vote]:
        """The votes approving the current arguments of this pending approval a quorum over 1 decides, oldest first.

        Read from the page's votes when a list page read them all at once (eligibility.mark).
        """
        if self.quorum <= 1 or self.status != self.Status.PENDING:
            return []
        votes = self.page_votes if self.page_votes is not None else self.votes.order_by("created_at", "id")
        digest = self.digest
        return [vote for vote in votes if vote.decision == self.Status.APPROVED and vote.arguments_digest == digest]

    @property
    def tally(self) -> str:
        """Say how far the quorum is: "1 of 2 approvals: bob"."""
        return self.tally_of(self.counted_voters)

    def tally_of(self, voters: list[str]) -> str:
        """Say how far the quorum is, given counted_voters (read already, e.g. with the votes)."""
        return f"{len(voters)} of {self.quorum} approvals" + (f": {', '.join(voters)}" if voters else "")


class Vote(models.Model):
    """One person's decision on an approval, bound to the digest of the arguments it approves."""

    # No index of its own: vote_once_per_digest starts with it.
    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="votes", db_index=False)
    voter = models.CharField(max_length=150)  # a username, from authentication (or the CLI's --by)
    decision = models.CharField(max_length=10)  # approved or rejected
    arguments_digest = models.CharField(max_length=64)
    arguments = models.JSONField(null=True, blank=True)  # this voter's edit, if any
    note = models.TextField(blank=True)
    # A question's answer from this voter (the tool gets the one that completed the quorum).
    payload = models.JSONField(null=True, blank=True)
    source = models.CharField(max_length=10)  # AuditEntry.Source
    origin = models.CharField(max_length=200, blank=True)
    policy_version = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            # The same person approving the same arguments again is one vote (idempotent).
            models.UniqueConstraint(
                fields=["approval", "voter", "arguments_digest", "decision"], name="vote_once_per_digest"
            )
        ]

    def __str__(self) -> str:
        return f"{self.voter} {self.decision} {self.approval_id}"


class RunEvent(models.Model):
    """Append-only log of what a viewer of a run may want; SSE replays it by seq."""

    class Type(models.TextChoices):
        MESSAGE = "message"
        DELTA = "delta"  # live only, never stored
        TOOL_CALL = "tool_call"
        TOOL_RESULT = "tool_result"
        APPROVAL_REQUIRED = "approval_required"
        APPROVAL_DECIDED = "approval_decided"
        APPROVAL_VOTED = "approval_voted"  # an approval counted towards a quorum not yet reached
        RUN_STATUS = "run_status"

    # No index of its own: runevent_run_seq starts with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=20, choices=Type.choices)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="runevent_run_seq")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"


class AuditEntry(models.Model):
    """Append-only record of every decision attempt, refused ones included."""

    class Source(models.TextChoices):
        WEB = "web"
        API = "api"
        CLI = "cli"
        SYSTEM = "system"
        EMAIL = "email"  # a one-click link from a notification mail
        SLACK = "slack"  # a button of a chat message

    class Outcome(models.TextChoices):
        DECIDED = "decided"
        IDEMPOTENT = "idempotent"  # the same decision again: nothing changed
        ALREADY_DECIDED = "already_decided"
        INVALID_ARGUMENTS = "invalid_arguments"
        NOT_PERMITTED = "not_permitted"
        NOT_FOUND = "not_found"
        EXPIRED = "expired"
        VOTED = "voted"  # an approval counted; the quorum is not reached yet
        DIGEST_MISMATCH = "digest_mismatch"  # the arguments changed since the reviewer looked

    approval_id = models.CharField(max_length=200, db_index=True)
    run_id = models.CharField(max_length=40, blank=True, db_index=True)
    tool = models.CharField(max_length=100, blank=True)
    action = models.CharField(max_length=20)  # approved, rejected, expired
    actor = models.CharField(max_length=150)  # who, from authentication
    on_behalf_of = models.CharField(max_length=150, blank=True)
    source = models.CharField(max_length=10, choices=Source.choices)
    origin = models.CharField(max_length=200, blank=True)  # IP address, or user@host for the CLI
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    detail = models.JSONField(default=dict, blank=True)  # note, edited-argument diff, error
    # Set by services.audit_append before the hash is taken (auto_now_add would set it after).
    created_at = models.DateTimeField(default=timezone.now, editable=False, db_index=True)
    # The chain (services/audit.py): the previous entry's hash, and sha256 of it and this entry's fields.
    # prev_hash is unique, so the database itself refuses a fork of the chain.
    prev_hash = models.CharField(max_length=64, unique=True, editable=False)
    hash = models.CharField(max_length=64, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        # Every filter of the audit page, each read newest first from its own index (a person is
        # the actor or the one acted for: two indexes the database combines).
        indexes = [
            models.Index(fields=["actor", "created_at"], name="audit_actor_created"),
            models.Index(fields=["on_behalf_of", "created_at"], name="audit_behalf_created"),
            models.Index(fields=["tool", "outcome", "created_at"], name="audit_tool_created"),
            models.Index(fields=["outcome", "created_at"], name="audit_outcome_created"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.approval_id}: {self.outcome}"


class SideEffect(models.Model):
    """Journal of the demo tools' real-world effects: one row per effect, never deduplicated.

    It stands for the outside world (a payment provider, a mail server), so it keeps every
    write it receives: a doubled effect shows up as two rows.
    """

    tool = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=250, db_index=True)
    arguments = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.tool} {self.idempotency_key}"


class ApiToken(models.Model):
    """A bearer token for the HTTP API; only a hash is stored, the secret is shown once."""

    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True)  # shown in listings, to revoke by
    token_hash = models.CharField(max_length=64, unique=True)  # sha256 of the whole token
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class SavedAgent(models.Model):
    """An agent composed in the playground and saved under a name by its owner."""

    # No index of its own: savedagent_owner_name starts with it.
    owner = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="saved_agents", db_index=False)
    name = models.CharField(max_length=80)
    definition = models.JSONField()  # the agent as agentfast.yaml would write it (playground.AgentForm.spec)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="savedagent_owner_name")]

    def __str__(self) -> str:
        return f"{self.name} ({self.owner})"


class Grant(models.Model):
    """A remembered decision (a standing grant): calls it matches are decided by it, nobody is asked."""

    class Scope(models.TextChoices):
        EXACT = "exact"  # these exact arguments
        TOOL = "tool"  # any arguments of this tool from this agent

    id = models.CharField(primary_key=True, max_length=20, editable=False)
    created_by = models.CharField(max_length=150)  # a username, from authentication
    decision = models.CharField(max_length=10)  # approved or rejected (Approval.Status)
    scope = models.CharField(max_length=10, choices=Scope.choices)
    tool = models.CharField(max_length=100)
    agent = models.CharField(max_length=100)
    # Whose calls it decides. agentfast.yaml names an internal agent, but an external caller
    # names its agent itself, so a grant given on an external run matches only calls of the
    # same account (the run's owner), and internal and external grants never match each other.
    kind = models.CharField(max_length=10, choices=Run.Kind.choices, default=Run.Kind.INTERNAL)
    account = models.CharField(max_length=150, blank=True)  # external: the owning account; internal: ""
    arguments_digest = models.CharField(max_length=64, blank=True)  # scope exact only
    approval_id = models.CharField(max_length=200, blank=True)  # the decision it remembers
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)
    uses = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "id"]
        indexes = [models.Index(fields=["tool", "agent", "kind", "account", "expires_at"], name="grant_lookup")]

    def __str__(self) -> str:
        return f"{self.id} {self.decision} {self.tool} ({self.scope})"

    @property
    def principal(self) -> str:
        """Return whose calls it decides, in words: the agent, and the account of an external one."""
        if self.kind != Run.Kind.EXTERNAL:
            return self.agent
        return f"{self.agent} of account {self.account}" if self.account else f"{self.agent} of an unknown account"


# Notification deliveries live with their channels; imported here so Django sees them as this app's models.
from agents.notify.models import (  # noqa: E402, F401
    Delivery,
    DeliveryAttempt,
    OneClickLink,
    PrunedFailures,
    SlackLink,
    SlackRequest,
)
