"""Websocket routes (the reviewers' live inbox)."""

from __future__ import annotations

from django.urls import path  # noqa: F401  (used once routes exist)

websocket_urlpatterns: list = []
