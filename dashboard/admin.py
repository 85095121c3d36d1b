"""The Django admin: a read-only window on the engine's rows.

Every state change goes through agents.services (compare-and-set, audit, events), so the
admin adds, changes and deletes nothing; the audit history above all is append-only.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import Field, Model, QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from agents import selectors, text
from agents.models import (
    ApiToken,
    Approval,
    AuditEntry,
    Delivery,
    Message,
    Run,
    RunEvent,
    SideEffect,
    ToolCall,
)

admin.site.site_header = "agentfast admin"
admin.site.site_title = "agentfast admin"
admin.site.index_title = "The engine's rows, read-only"
admin.site.site_url = "/"


# The engine's tables grow by rows per decision, for ever (a million audit entries is a year
# of a busy team): a list page must read a bounded number of rows, as the dashboard's do.
COUNT_CAP = 10_000  # rows a list counts before it says "10000+": 100 pages of 100
RECENT_ROWS = 10_000  # newest rows a filter reads its values from


class BoundedCountPaginator(Paginator):
    """Count no further than COUNT_CAP rows; pages past them are reached by filtering.

    Django's paginator runs COUNT(*) over the whole filtered table at every list page.
    """

    @cached_property
    def counted(self) -> int:
        return selectors.count_up_to(cast("QuerySet[Any]", self.object_list), COUNT_CAP + 1)  # the admin's list

    @cached_property
    def count(self) -> int:
        return min(self.counted, COUNT_CAP)

    @property
    def more(self) -> bool:
        """Whether there are rows past the ones counted (the templates add a "+")."""
        return self.counted > COUNT_CAP


class RecentValuesFilter(admin.AllValuesFieldListFilter):
    """Offer the values of the newest RECENT_ROWS rows: Django's DISTINCT over all of them is a full scan.

    A value only older rows hold can still be filtered on by its URL (?tool=...), or searched.
    """

    def __init__(
        self,
        field: Field,
        request: HttpRequest,
        params: dict[str, Any],
        model: type[Model],
        model_admin: admin.ModelAdmin,
        field_path: str,
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        # Read in Python: the database plans DISTINCT ... WHERE pk IN (newest) over the whole table.
        newest = model._default_manager.order_by("-pk").values_list(field.name, flat=True)[:RECENT_ROWS]
        values = sorted(set(newest), key=lambda value: (value is None, value))
        self.lookup_choices = cast("QuerySet[Any]", values)  # the filter only iterates and measures it


class ReadOnlyAdmin(admin.ModelAdmin):
    """Read-only, with list pages of bounded cost; searches match whole ids on their indexes (a
    substring search reads every row: 0.7 s at a million audit entries).
    """

    paginator = BoundedCountPaginator
    show_full_result_count = False  # a second COUNT(*), of the unfiltered table
    show_facets = admin.ShowFacets.NEVER  # a count per filter choice, over the whole table

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        """Return the row with its text repaired for display: every stored row must render."""
        if text.problem(object_id) is not None:  # no row has such an id (and PostgreSQL refuses NUL)
            return None
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            for field in obj._meta.concrete_fields:
                value = getattr(obj, field.attname)
                if isinstance(value, str | dict | list):
                    setattr(obj, field.attname, text.repair(value, max_depth=text.MAX_STORED_DEPTH))
        return obj

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """Refuse, as the admin refuses an unknown field (?e=1), filters the database would fail on.

        A value holding NUL fails on PostgreSQL when the list is read, and a lookup like
        `created_at__year=99999` when its SQL is written: both after the admin's own checks.
        """
        if any(text.problem(value) is not None for _, values in request.GET.lists() for value in values):
            raise IncorrectLookupParameters("a filter holds NUL or a lone surrogate")
        try:
            return super().get_changelist_instance(request)  # which counts the list: the SQL is written here
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from None

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "agent", "status", "created_by", "created_at", "updated_at")
    list_filter = ("status", ("agent", RecentValuesFilter))
    search_fields = ("id__exact",)
    search_help_text = "A run id, whole (the runs page searches what runs were asked)."


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ("run", "seq", "role", "created_at")
    list_filter = ("role",)
    search_fields = ("run__id__exact",)
    search_help_text = "A run id, whole."


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ("run", "call_id", "name", "status", "hitl_mode", "executed_at")
    list_filter = ("status", ("name", RecentValuesFilter))
    search_fields = ("run__id__exact",)
    search_help_text = "A run id, whole."


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("id", "tool", "mode", "status", "decided_by", "decided_at", "created_at")
    list_filter = ("status", "mode", ("tool", RecentValuesFilter))
    search_fields = ("id__exact", "run__id__exact")
    search_help_text = "An approval id or a run id, whole (the audit page goes by person)."


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ("run", "seq", "type", "created_at")
    list_filter = ("type",)
    search_fields = ("run__id__exact",)
    search_help_text = "A run id, whole."


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "tool", "approval_id", "source", "outcome")
    list_filter = (
        ("created_at", admin.DateFieldListFilter),  # not date_hierarchy, whose years are a DISTINCT over all rows
        "outcome",
        "source",
        ("action", RecentValuesFilter),
        ("tool", RecentValuesFilter),
    )
    search_fields = ("actor__exact", "on_behalf_of__exact", "approval_id__exact", "run_id__exact")
    search_help_text = "A username (who decided, or on whose behalf), an approval id or a run id, whole."


@admin.register(SideEffect)
class SideEffectAdmin(ReadOnlyAdmin):
    list_display = ("tool", "idempotency_key", "created_at")
    list_filter = (("tool", RecentValuesFilter),)
    search_fields = ("idempotency_key__exact",)
    search_help_text = "An idempotency key (an approval id, or run id:call id), whole."


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "revoked_at")
    # The hash is a credential verifier: not worth showing to anyone.
    exclude = ("token_hash",)


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "event_type", "target", "status", "attempts", "next_attempt_at", "created_at")
    list_filter = ("kind", "status", ("event_type", RecentValuesFilter))
    search_fields = ("approval_id__exact",)
    search_help_text = "An approval id, whole."
