"""Forms of the dashboard: a reviewer's decision, and the filters of the lists."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any

from django import forms
from django.db.models import Q, QuerySet
from django.utils import timezone

from agents import selectors
from agents import text as agents_text
from agents.models import Approval, AuditEntry, Run
from agents.services.approvals import MAX_TEXT_CHARS


class DecisionForm(forms.Form):
    """Approve (the arguments as proposed or edited) or reject (with a note, maybe feedback)."""

    decision = forms.ChoiceField(choices=[("approved", "Approve"), ("rejected", "Reject")])
    # templates/dashboard/_decision.html lays the fields out itself, errors next to each.
    arguments = forms.CharField(required=False, strip=False)
    note = forms.CharField(required=False, max_length=MAX_TEXT_CHARS)
    feedback = forms.CharField(required=False, max_length=MAX_TEXT_CHARS)
    answer = forms.CharField(required=False, max_length=MAX_TEXT_CHARS)

    def __init__(self, *args: Any, approval: Approval, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.approval = approval
        self.fields["arguments"].initial = agents_text.dumps(approval.tool_call.arguments or {}, indent=2)

    def clean_arguments(self) -> dict[str, Any] | None:
        text = self.cleaned_data["arguments"].strip()
        if not text:
            return None
        try:
            # Strict: a person's JSON with NaN, NUL, lone surrogates or deep nesting is refused here.
            value = agents_text.loads_strict(text, field="arguments")
        except agents_text.UnsafeText as exc:
            raise forms.ValidationError(
                f"These arguments cannot be used: {exc.message.removeprefix('arguments: ')}."
            ) from None
        if not isinstance(value, dict):
            raise forms.ValidationError('The arguments must be a JSON object, like {"order_id": "A1001"}.')
        return value

    def edited_arguments(self) -> dict[str, Any] | None:
        """Return the arguments to approve with, or None when they are the model's own.

        The editor is prefilled with the proposal, so an untouched editor is a plain approval,
        and a rejection never carries arguments.
        """
        arguments = self.cleaned_data.get("arguments")
        if self.cleaned_data["decision"] != Approval.Status.APPROVED or arguments == self.approval.tool_call.arguments:
            return None
        return arguments

    def payload(self) -> dict[str, Any] | None:
        """Return the answer to a tool that asked a question itself, as its payload."""
        answer = self.cleaned_data.get("answer", "")
        if self.approval.request is None or self.cleaned_data["decision"] != Approval.Status.APPROVED or not answer:
            return None
        return {"answer": answer}

    def add_service_error(self, field: str, message: str) -> None:
        """Attach a service's InvalidInput to the field it names (`arguments.amount_cents` → arguments)."""
        name = field.split(".", 1)[0]
        self.add_error(name if name in self.fields else None, message)


class InboxFilter(forms.Form):
    agent = forms.CharField(required=False)
    tool = forms.CharField(required=False)

    def pending_approvals(self) -> QuerySet[Approval]:
        """Return the pending approvals the filtered inbox lists, newest first."""
        approvals = selectors.approval_list(status=Approval.Status.PENDING)
        if not self.is_valid():
            return approvals
        if agent := self.cleaned_data["agent"]:
            approvals = approvals.filter(run__agent=agent)
        if tool := self.cleaned_data["tool"]:
            approvals = approvals.filter(tool=tool)
        return approvals

    def matches(self, approval: Approval) -> bool:
        """Return whether a live approval belongs in a list with these filters."""
        if not self.is_valid():
            return True
        agent, tool = self.cleaned_data["agent"], self.cleaned_data["tool"]
        return (not agent or approval.run.agent == agent) and (not tool or approval.tool == tool)


class RunFilter(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="Search")
    status = forms.ChoiceField(required=False, choices=[("", "All"), *Run.Status.choices])
    agent = forms.CharField(required=False, max_length=100)
    creator = forms.CharField(required=False, max_length=150)
    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def clean_q(self) -> str:
        try:
            return agents_text.require_clean(self.cleaned_data["q"], field="search")
        except agents_text.UnsafeText as exc:
            raise forms.ValidationError(str(exc)) from None

    def runs(self) -> QuerySet[Run]:
        """Return the runs these filters select; filters that do not parse are ignored, one by one."""
        self.is_valid()
        data = getattr(self, "cleaned_data", {})
        until = data.get("until")
        runs = selectors.run_search(
            query=data.get("q", ""),
            status=data.get("status") or None,
            agent=data.get("agent") or None,
            created_by=data.get("creator") or None,
            since=_day_start(data["since"]) if data.get("since") else None,
            until=_day_start(until + timedelta(days=1)) if until and until < date.max else None,
        )
        return runs.none() if "q" in self.errors else runs  # a search that cannot be read matches nothing


class AuditFilter(forms.Form):
    person = forms.CharField(required=False)
    tool = forms.CharField(required=False)
    outcome = forms.ChoiceField(required=False, choices=[("", "Any outcome"), *AuditEntry.Outcome.choices])
    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def apply(self, entries: QuerySet[AuditEntry]) -> QuerySet[AuditEntry]:
        if not self.is_valid():
            return entries.none()
        data = self.cleaned_data
        if data["person"]:
            entries = entries.filter(Q(actor=data["person"]) | Q(on_behalf_of=data["person"]))
        if data["tool"]:
            entries = entries.filter(tool=data["tool"])
        if data["outcome"]:
            entries = entries.filter(outcome=data["outcome"])
        if data["since"]:
            entries = entries.filter(created_at__gte=_day_start(data["since"]))
        if data["until"] and data["until"] < date.max:  # the last day there is has no end to filter by
            entries = entries.filter(created_at__lt=_day_start(data["until"] + timedelta(days=1)))
        return entries


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))
