"""Work on a thread of its own, as another process would do it: with its own database connection."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connection


def started(task: Callable[[], object]) -> threading.Thread:
    """Start `task` on a new thread, which closes its database connection when the task ends."""

    def body() -> None:
        try:
            task()
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread
