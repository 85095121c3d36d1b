"""Websocket routes: the reviewers' live inbox and run timelines; any other path is closed with 4404."""

from __future__ import annotations

from django.urls import path, re_path

from dashboard.live import consumers

websocket_urlpatterns = [
    path("ws/inbox/", consumers.InboxConsumer.as_asgi()),
    path("ws/runs/<str:run_id>/", consumers.RunConsumer.as_asgi()),
    path("ws/approvals/", consumers.ApprovalConsumer.as_asgi()),
    # Last: without it an unknown path raised inside the router (a 500 and a traceback).
    re_path(r"", consumers.UnknownPathConsumer.as_asgi()),
]
