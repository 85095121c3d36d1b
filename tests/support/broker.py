"""Read what the project left in the test Redis broker: which task messages wait, and for when."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

import redis


def take_queued(broker: redis.Redis, task: str) -> list[tuple[list[Any], dict[str, Any], datetime | None]]:
    """Remove the task's messages waiting in the broker's queues and return their arguments, keywords and eta."""
    found = []
    for key in broker.keys("celery*"):
        if broker.type(key) != b"list":
            continue
        for raw in broker.lrange(key, 0, -1):
            message = json.loads(raw)
            if message["headers"]["task"] != task:
                continue
            args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
            eta = message["headers"].get("eta")
            found.append((args, kwargs, datetime.fromisoformat(eta) if eta else None))
            broker.lrem(key, 1, raw)  # the other tasks' messages stay for the next look
    return found
