"""What tests of mailed links and Slack buttons share: the links a mail carries, a request Slack signs."""

from __future__ import annotations

import hashlib
import hmac
import re
import time

from django.core import mail


def mailed_links(message: mail.EmailMessage) -> dict[str, str]:
    """Return the paths of a mail's one-click links, by the decision each takes."""
    found = dict(re.findall(r"(Approve|Reject): +http://localhost:8321(/integrations/email/\S+)", message.body))
    return {"approved": found["Approve"], "rejected": found["Reject"]}


def slack_signed(body: bytes, *, secret: str, at: int | None = None) -> dict[str, str]:
    """Return the headers Slack signs a request with (v0, at `at` or now), as test-client keyword arguments."""
    stamp = str(int(time.time()) if at is None else at)
    digest = hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {"HTTP_X_SLACK_REQUEST_TIMESTAMP": stamp, "HTTP_X_SLACK_SIGNATURE": f"v0={digest}"}
