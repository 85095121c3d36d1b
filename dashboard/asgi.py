"""ASGI entry point: HTTP through Django behind the body and stream guards, websockets through
Channels (session auth, exact origin)."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django.setup(set_prefix=False)

# The app registry is ready from here on.
from django.conf import settings

from dashboard.threaded import ThreadedSyncViews

django_asgi_app = ThreadedSyncViews(threads=settings.AGENTFAST_WEB_THREADS)

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from dashboard.limits import BodyLimit, SharedStreamThread, guard_daphne  # noqa: E402
from dashboard.origin import SameOriginValidator  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodyLimit(SharedStreamThread(django_asgi_app)),
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

guard_daphne()  # under daphne, refuse oversized or anonymous bodies before daphne buffers them
