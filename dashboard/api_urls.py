"""The JSON API, its OpenAPI schema (/api/openapi.json), docs (/api/docs) and SSE streams."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path, re_path

from dashboard.api import api, not_found

urlpatterns: list[URLPattern | URLResolver] = [
    path("", api.urls),
    re_path(r"", not_found),
]
