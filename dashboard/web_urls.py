"""Pages of the reviewers' dashboard."""

from __future__ import annotations

from django.urls import path

from dashboard import policy_views, views

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("approvals/bulk", views.approval_bulk, name="approval-bulk"),
    path("inbox/filters", views.inbox_filter_save, name="inbox-filter-save"),
    path("approvals/<str:approval_id>", views.approval_detail, name="approval"),
    path("approvals/<str:approval_id>/decide", views.approval_decide, name="approval-decide"),
    path("runs", views.run_list, name="runs"),
    path("runs/<str:run_id>", views.run_detail, name="run"),
    path("audit", views.audit, name="audit"),
    path("audit.csv", views.audit_csv, name="audit-csv"),
    path("policy", policy_views.policy_list, name="policy"),
    path("policy/<str:tool>", policy_views.policy_tool, name="policy-tool"),
    path("healthz", views.healthz, name="healthz"),
]
