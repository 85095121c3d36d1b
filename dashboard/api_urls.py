"""The JSON API and its SSE streams."""

from __future__ import annotations

urlpatterns: list = []
