"""What tests of mailed links and Slack buttons share: the links a mail carries, pressing one, a request Slack signs."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable

from django.core import mail
from django.test import Client


def mailed_links(message: mail.EmailMessage) -> dict[str, str]:
    """Return the paths of a mail's one-click links, by the decision each takes."""
    found = dict(re.findall(r"(Approve|Reject): +http://localhost:8321(/integrations/email/\S+)", message.body))
    return {"approved": found["Approve"], "rejected": found["Reject"]}


def confirm_link(client: Client, path: str, *, between: Callable[[], object] | None = None) -> tuple[int, str]:
    """Open a mailed link's page and press its button, as its recipient would; return the answer's status and text.

    `between` runs after the page opened and before the press (someone else decides meanwhile, say).
    """
    page = client.get(path)
    if page.status_code != 200:
        return page.status_code, page.content.decode()
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content).group(1).decode()
    if between is not None:
        between()
    answer = client.post(path, {"csrfmiddlewaretoken": token})
    return answer.status_code, answer.content.decode()


def slack_signed(body: bytes, *, secret: str, at: int | None = None) -> dict[str, str]:
    """Return the headers Slack signs a request with (v0, at `at` or now), as test-client keyword arguments."""
    stamp = str(int(time.time()) if at is None else at)
    digest = hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {"HTTP_X_SLACK_REQUEST_TIMESTAMP": stamp, "HTTP_X_SLACK_SIGNATURE": f"v0={digest}"}
