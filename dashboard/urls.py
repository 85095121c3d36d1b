from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("api/", include("dashboard.api.urls")),
    path("", include("dashboard.integrations.urls")),
    path("", include("dashboard.web.urls")),
]
