"""Pages of the reviewers' dashboard."""

from __future__ import annotations

from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from dashboard import grant_views, insights, metrics, policy_views, views

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("approvals/bulk", views.approval_bulk, name="approval-bulk"),
    path("inbox/filters", views.inbox_filter_save, name="inbox-filter-save"),
    path("approvals/<str:approval_id>", views.approval_detail, name="approval"),
    path("approvals/<str:approval_id>/decide", views.approval_decide, name="approval-decide"),
    path("approvals/<str:approval_id>/extend", views.approval_extend, name="approval-extend"),
    path("approvals/<str:approval_id>/run-now", views.approval_run_now, name="approval-run-now"),
    path("runs", views.run_list, name="runs"),
    path("runs/<str:run_id>", views.run_detail, name="run"),
    path("runs/<str:run_id>/cancel", views.run_cancel, name="run-cancel"),
    path("audit", views.audit, name="audit"),
    path("audit.csv", views.audit_csv, name="audit-csv"),
    path("policy", policy_views.policy_list, name="policy"),
    path("policy/<str:tool>", policy_views.policy_tool, name="policy-tool"),
    path("insights", insights.insights_page, name="insights"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("favicon.ico", RedirectView.as_view(url=static("favicon.ico"), permanent=True)),
    path("grants", grant_views.grant_list, name="grants"),
    path("grants/<str:grant_id>/revoke", grant_views.grant_revoke, name="grant-revoke"),
    path("healthz", views.healthz, name="healthz"),
]
