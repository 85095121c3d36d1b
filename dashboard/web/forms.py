"""Forms of the dashboard: a reviewer's decision, and the filters of the lists."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any

from django import forms
from django.db.models import QuerySet
from django.utils import timezone

from agents import selectors
from agents import text as agents_text
from agents.models import Approval, AuditEntry, Run
from agents.services import eligibility
from agents.services.approvals import MAX_TEXT_CHARS
from agents.services.grants import Remember
from dashboard.templatetags.agentfast import shown_json

REMEMBER_FOR = [("3600", "for 1 h"), ("28800", "for 8 h"), ("86400", "for 24 h")]
REMEMBER_SCOPES = [
    ("exact", "for these exact arguments"),
    ("tool", "for any arguments of this tool from this agent"),
]


class DecisionForm(forms.Form):
    """Approve (the arguments as proposed or edited) or reject (with a note, maybe feedback)."""

    decision = forms.ChoiceField(choices=[("approved", "Approve"), ("rejected", "Reject")])
    # templates/dashboard/_decision.html lays the fields out itself, errors next to each.
    arguments = forms.CharField(required=False, strip=False)
    note = forms.CharField(required=False, max_length=MAX_TEXT_CHARS)
    feedback = forms.CharField(required=False, max_length=MAX_TEXT_CHARS)
    answer = forms.CharField(required=False, max_length=MAX_TEXT_CHARS)
    # The digest of the arguments the reviewer saw: the decision is refused (409) if they changed.
    expect_digest = forms.RegexField(required=False, regex=r"^[0-9a-fA-F]{12,64}$")
    # "Approve (or reject) and remember": a standing grant for this long, for these arguments or the whole tool.
    remember = forms.ChoiceField(required=False, choices=[("", "Don't remember"), *REMEMBER_FOR])
    remember_scope = forms.ChoiceField(required=False, choices=REMEMBER_SCOPES)

    def __init__(self, *args: Any, approval: Approval, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.approval = approval
        self.fields["arguments"].initial = shown_json(approval.current_arguments or {}, indent=2)
        self.fields["expect_digest"].initial = approval.digest

    def clean_arguments(self) -> dict[str, Any] | None:
        """Return the arguments in the editor; None when none were sent (an inbox card), or with a rejection.

        The approval page's editor starts filled with the proposal, so a blank one was erased:
        approving it is refused rather than read as "the proposal as it is". A rejection never
        carries arguments, so an edit begun and abandoned for it (half-typed JSON) is not read.
        """
        text = self.cleaned_data["arguments"].strip()
        if self.cleaned_data.get("decision") == Approval.Status.REJECTED:
            return None
        if not text:
            if "arguments" in self.data and self.cleaned_data.get("decision") == Approval.Status.APPROVED:
                raise forms.ValidationError(
                    "The arguments are empty: put them back, or reset them to the proposal, to approve."
                )
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
        if self.cleaned_data["decision"] != Approval.Status.APPROVED or arguments == self.approval.current_arguments:
            return None
        return arguments

    def payload(self) -> dict[str, Any] | None:
        """Return the answer to a tool that asked a question itself, as its payload."""
        answer = self.cleaned_data.get("answer", "")
        if self.approval.request is None or self.cleaned_data["decision"] != Approval.Status.APPROVED or not answer:
            return None
        return {"answer": answer}

    def remembered(self) -> Remember | None:
        """Return what the reviewer asked to remember, or None."""
        chosen = self.cleaned_data.get("remember") or ""
        if not chosen:
            return None
        return Remember.of(self.cleaned_data.get("remember_scope") or "exact", int(chosen))

    def add_service_error(self, field: str, message: str) -> None:
        """Attach a service's InvalidInput to the field it names (`arguments.amount_cents` → arguments)."""
        name = field.split(".", 1)[0]
        self.add_error(name if name in self.fields else None, message)


class InboxFilter(forms.Form):
    """The inbox's filters: "For me" (the default) or "All", agent, tool, words to search, and the order."""

    MINE, ALL = "mine", "all"
    KEYS = ("show", "agent", "tool", "q", "order")  # what a saved filter keeps

    show = forms.ChoiceField(required=False, choices=[(MINE, "For me"), (ALL, "All")])
    agent = forms.CharField(required=False)
    tool = forms.CharField(required=False)
    q = forms.CharField(required=False, max_length=200, label="Search")
    order = forms.ChoiceField(
        required=False,
        choices=[(selectors.OLDEST, "Oldest first"), (selectors.NEWEST, "Newest first")],
    )

    def clean_q(self) -> str:
        return _clean_text(self.cleaned_data["q"])

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user

    def value(self, key: str) -> str:
        """Return one filter as cleaned, or "" when it is not given or does not read (the page names it).

        Filters are taken one by one, as on /runs: a bad order keeps the tool and the search.
        """
        self.is_valid()
        return str(self.cleaned_data.get(key) or "")

    @property
    def for_me(self) -> bool:
        return self.value("show") != self.ALL

    @property
    def ordering(self) -> str:
        return self.value("order") or selectors.OLDEST

    @property
    def search(self) -> str:
        return self.value("q")

    def applied(self) -> dict[str, str]:
        """Return the filters that read and were given: what the list shows, for its live socket's URL."""
        return {key: self.value(key) for key in self.KEYS if self.value(key)}

    def pending_approvals(self, groups: set[str] | None = None) -> QuerySet[Approval]:
        """Return the pending approvals the filtered inbox lists, longest waiting first unless asked otherwise.

        `groups` are the user's group names when the caller read them already.
        """
        approvals = selectors.approval_list(
            status=Approval.Status.PENDING,
            agent=self.value("agent") or None,
            tool=self.value("tool") or None,
            search=self.search,
            order=self.ordering,
        )
        return eligibility.decidable(self.user, approvals, groups) if self.for_me else approvals

    def matches(self, approval: Approval) -> bool:
        """Return whether a live approval belongs in a list with these filters."""
        if self.for_me and not eligibility.may_decide(self.user, approval):
            return False
        agent, tool = self.value("agent"), self.value("tool")
        if self.search and not selectors.approval_matches(approval.pk, self.search):
            return False
        return (not agent or approval.run.agent == agent) and (not tool or approval.tool == tool)


def _clean_text(value: str) -> str:
    """Refuse text a person typed that cannot be stored or searched (NUL, lone surrogates)."""
    problem = agents_text.problem(value)
    if problem is not None:
        raise forms.ValidationError(f"This cannot be searched: {problem}.")
    return value.strip()


class _CardsField(forms.MultipleChoiceField):
    """Selected cards as "appr_…:digest" values; any approval id may be named (the service says if it exists)."""

    def valid_value(self, value: Any) -> bool:
        approval_id, _, digest = str(value).rpartition(":")
        return bool(approval_id) and agents_text.problem(str(value)) is None and len(digest) <= 64


class BulkDecisionForm(forms.Form):
    """Several cards decided together: each id with the digest of the arguments the reviewer saw."""

    MAX_CARDS = 100

    decision = forms.ChoiceField(choices=[("approved", "Approve"), ("rejected", "Reject")])
    note = forms.CharField(required=False, max_length=MAX_TEXT_CHARS)
    # The digest binds each decision to the arguments the reviewer was shown.
    cards = _CardsField()

    def clean_cards(self) -> list[tuple[str, str]]:
        cards = self.cleaned_data["cards"]
        if len(cards) > self.MAX_CARDS:
            raise forms.ValidationError(f"Select at most {self.MAX_CARDS} cards at a time.")
        return [(value.rpartition(":")[0], value.rpartition(":")[2]) for value in dict.fromkeys(cards)]

    def clean_note(self) -> str:
        return _clean_text(self.cleaned_data["note"])


class SavedFilterForm(forms.Form):
    """Name the inbox's current filters to come back to them."""

    name = forms.CharField(max_length=60, error_messages={"required": "Give the filter a name."})
    query = forms.CharField(required=False, max_length=1000)

    def clean_name(self) -> str:
        name = _clean_text(self.cleaned_data["name"])
        if not name:
            raise forms.ValidationError("Give the filter a name.")
        return name


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

    def clean(self) -> dict[str, Any]:
        return _refuse_inverted_range(self, super().clean() or {})

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

    def clean(self) -> dict[str, Any]:
        return _refuse_inverted_range(self, super().clean() or {})

    def entries(self) -> QuerySet[AuditEntry]:
        """Return the audit entries these filters select (none when they are invalid)."""
        if not self.is_valid():
            return selectors.audit_entries().none()
        data = self.cleaned_data
        until = data["until"]
        return selectors.audit_entries(
            person=data["person"],
            tool=data["tool"],
            outcome=data["outcome"],
            since=_day_start(data["since"]) if data["since"] else None,
            # The last day there is has no end to filter by.
            until=_day_start(until + timedelta(days=1)) if until and until < date.max else None,
        )


def _refuse_inverted_range(form: forms.Form, data: dict[str, Any]) -> dict[str, Any]:
    """Name a To before From (swapped in a hurry), which would otherwise list nothing, as if nothing happened."""
    since, until = data.get("since"), data.get("until")
    if since and until and until < since:
        form.add_error("until", "To is before From: swap them.")
    return data


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))
