"""The developers' playground."""

from __future__ import annotations

urlpatterns: list = []
