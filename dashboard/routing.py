"""Websocket routes: the reviewers' live inbox and run timelines."""

from __future__ import annotations

from django.urls import path

from dashboard import consumers

websocket_urlpatterns = [
    path("ws/inbox/", consumers.InboxConsumer.as_asgi()),
    path("ws/runs/<str:run_id>/", consumers.RunConsumer.as_asgi()),
]
