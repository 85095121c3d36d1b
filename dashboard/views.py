"""Pages of the dashboard."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from agents import selectors


def home(request: HttpRequest) -> HttpResponse:
    pending = selectors.approval_list(status="pending").count() if request.user.is_authenticated else None
    return render(request, "dashboard/home.html", {"pending": pending})


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})
