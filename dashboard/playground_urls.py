"""The developers' playground."""

from __future__ import annotations

from django.urls import URLPattern, path

from dashboard import playground

urlpatterns: list[URLPattern] = [
    path("", playground.page, name="playground"),
    path("runs", playground.run_create, name="playground-run-create"),
    path("agents", playground.agent_save, name="playground-agent-save"),
]
