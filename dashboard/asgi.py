"""ASGI entry point: HTTP through Django behind the body and stream guards, websockets through
Channels (session auth, exact origin)."""

from __future__ import annotations

import gc
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

from dashboard.limits import BodyLimit, EndFailedResponses, SharedStreamThread, guard_daphne  # noqa: E402
from dashboard.live.routing import websocket_urlpatterns  # noqa: E402
from dashboard.origin import SameOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        # EndFailedResponses inside SharedStreamThread: the stream's live frames go to daphne's own send.
        "http": BodyLimit(SharedStreamThread(EndFailedResponses(django_asgi_app))),
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

guard_daphne()  # under daphne, refuse oversized or anonymous bodies before daphne buffers them

# What the process loaded to get here lives as long as it does: keep it out of the
# collector's full passes, which with thousands of open streams stalled all of them.
gc.freeze()
