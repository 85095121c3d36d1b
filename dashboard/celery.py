"""The Celery application; tasks live in agents.tasks."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")


def _lost_broker_stops_no_worker() -> None:
    """Make a Redis channel whose transport was let go fail with a connection error, not an AttributeError."""
    from kombu.transport import redis as kombu_redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    # A worker that loses Redis while it holds unacknowledged messages (an eta, a prefetched
    # task) has its consumer collect the broken connection, which detaches the transport, and
    # then close it: kombu's second close of the channel hands the messages back through a new
    # pool, built from the detached transport's URL (None). The AttributeError escaped the
    # consumer's reconnect and ended the worker and its beat for good. A connection error is
    # what kombu expects there: the messages stay in Redis's unacked hash (visible again after
    # the visibility timeout), the worker reconnects, and the sweeper re-enqueues the work.
    connparams = kombu_redis.Channel._connparams

    def _connparams(channel: Any, asynchronous: bool = False) -> dict[str, Any]:
        if getattr(channel.connection, "client", None) is None:
            raise RedisConnectionError("this channel's broker connection is closed")
        return connparams(channel, asynchronous=asynchronous)

    kombu_redis.Channel._connparams = _connparams  # type: ignore[method-assign]


_lost_broker_stops_no_worker()
app = Celery("agentfast")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["agents", "agents.notify"])


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    """Give a forked pool child its own database connections (and pool): sockets must not be shared."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        connection.close()
        close_pool = getattr(connection, "close_pool", None)
        if close_pool is not None:
            close_pool()


@worker_init.connect
def _preload_model_providers(**_: object) -> None:
    """Import the model providers agentfast.yaml's agents use before the worker takes work."""
    from agents.llm.base import preload_providers
    from agents.policy import ConfigError, get_policy

    try:
        preload_providers(agent.model for agent in get_policy().agents.values())
    except ConfigError:
        pass  # the first drive reports it, as without this
