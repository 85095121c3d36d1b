"""Pages of the reviewers' dashboard."""

from __future__ import annotations

from django.urls import path

from dashboard import views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
]
