"""ASGI entry point: HTTP through Django behind the body and stream guards, websockets through
Channels (session auth, exact origin)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django_asgi_app = get_asgi_application()

# Channels' imports need the app registry ready, hence after get_asgi_application().
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
