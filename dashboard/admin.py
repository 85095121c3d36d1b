"""The Django admin: a read-only window on the engine's rows.

Every state change goes through agents.services (compare-and-set, audit, events), so the
admin adds, changes and deletes nothing; the audit history above all is append-only.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest

from agents import text
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


class ReadOnlyAdmin(admin.ModelAdmin):
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
    list_filter = ("status", "agent")
    search_fields = ("id", "input")


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ("run", "seq", "role", "created_at")
    list_filter = ("role",)
    search_fields = ("run__id",)


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ("run", "call_id", "name", "status", "hitl_mode", "executed_at")
    list_filter = ("status", "name")
    search_fields = ("run__id", "call_id")


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("id", "tool", "mode", "status", "decided_by", "decided_at", "created_at")
    list_filter = ("status", "mode", "tool")
    search_fields = ("id", "run__id", "decided_by")


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ("run", "seq", "type", "created_at")
    list_filter = ("type",)
    search_fields = ("run__id",)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "tool", "approval_id", "source", "outcome")
    list_filter = ("outcome", "source", "action", "tool")
    search_fields = ("actor", "on_behalf_of", "approval_id", "run_id")
    date_hierarchy = "created_at"


@admin.register(SideEffect)
class SideEffectAdmin(ReadOnlyAdmin):
    list_display = ("tool", "idempotency_key", "created_at")
    list_filter = ("tool",)
    search_fields = ("idempotency_key",)


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "revoked_at")
    # The hash is a credential verifier: not worth showing to anyone.
    exclude = ("token_hash",)


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "event_type", "target", "status", "attempts", "next_attempt_at", "created_at")
    list_filter = ("kind", "status", "event_type")
    search_fields = ("approval_id", "target")
