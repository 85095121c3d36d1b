"""Pages of the reviewers' dashboard, and the developers' playground."""

from __future__ import annotations

from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from dashboard import metrics
from dashboard.web import approvals, audit, grants, health, inbox, insights, playground, policy, runs

urlpatterns = [
    path("", inbox.inbox, name="inbox"),
    path("inbox/filters", inbox.inbox_filter_save, name="inbox-filter-save"),
    path("approvals/bulk", approvals.approval_bulk, name="approval-bulk"),
    path("approvals/<str:approval_id>", approvals.approval_detail, name="approval"),
    path("approvals/<str:approval_id>/decide", approvals.approval_decide, name="approval-decide"),
    path("approvals/<str:approval_id>/extend", approvals.approval_extend, name="approval-extend"),
    path("approvals/<str:approval_id>/run-now", approvals.approval_run_now, name="approval-run-now"),
    path("runs", runs.run_list, name="runs"),
    path("runs/<str:run_id>", runs.run_detail, name="run"),
    path("runs/<str:run_id>/cancel", runs.run_cancel, name="run-cancel"),
    path("audit", audit.audit, name="audit"),
    path("audit.csv", audit.audit_csv, name="audit-csv"),
    path("policy", policy.policy_list, name="policy"),
    path("policy/<path:tool>", policy.policy_tool, name="policy-tool"),  # a tool name may hold "/"
    path("insights", insights.insights_page, name="insights"),
    path("grants", grants.grant_list, name="grants"),
    path("grants/<str:grant_id>/revoke", grants.grant_revoke, name="grant-revoke"),
    path("playground/", playground.page, name="playground"),
    path("playground/runs", playground.run_create, name="playground-run-create"),
    path("playground/agents", playground.agent_save, name="playground-agent-save"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("favicon.ico", RedirectView.as_view(url=static("favicon.ico"), permanent=True)),
    path("healthz", health.healthz, name="healthz"),
]
