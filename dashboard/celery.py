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


def _one_client_per_pool() -> None:
    """Make a Redis channel reuse one client on its connection pool instead of building one per command."""
    from kombu.transport import redis as kombu_redis
    from redis import Redis

    # kombu builds a new redis.Redis for each publish, each acknowledgement and each update of
    # its unacked index (Channel.conn_or_acquire). The constructor alone, which fills the
    # client's table of response callbacks, took about 0.12 ms here: as long as the command,
    # and a third of the CPU of sending a task. A client holds no connection of its own (each
    # command borrows one from the pool) and is safe to share between threads, so one client
    # per pool serves them all; a channel that replaces its pool (kombu does after a lost
    # connection) gets a new client with it.
    create_client = kombu_redis.Channel._create_client

    def _create_client(channel: Any, asynchronous: bool = False) -> Redis:
        if asynchronous:  # the channel's own BRPOP/LISTEN client, already made once per channel
            return create_client(channel, asynchronous=True)
        pool = channel.pool
        shared = channel.__dict__.get("_shared_client")
        if shared is None or shared.connection_pool is not pool:
            shared = channel._shared_client = create_client(channel)
        return shared

    kombu_redis.Channel._create_client = _create_client  # type: ignore[method-assign]


_lost_broker_stops_no_worker()
_one_client_per_pool()
app = Celery("agentfast")
app.autodiscover_tasks(["agents", "agents.notify"])


@app.on_configure.connect
def _django_settings_once(sender: Celery, **_: object) -> None:
    """Configure Celery from Django's CELERY_ settings, copied into a dict when Celery first reads them.

    This is `config_from_object("django.conf:settings", namespace="CELERY")` with a dict for the
    settings object: Celery looks up about seven settings for each task it sends, trying the
    CELERY_ name and then the bare one before its defaults, and each miss on the settings
    object raised an AttributeError: about 0.08 ms of the 0.5 ms a task took to send here.

    The keys are given in Celery's own lowercase names: given as CELERY_TASK_SERIALIZER and
    the like, three of them also match Celery 3's names, and every worker start warned that
    those settings are deprecated.
    """
    from django.conf import settings

    names = (name for name in dir(settings) if name.startswith("CELERY_"))
    sender.config_from_object({name.removeprefix("CELERY_").lower(): getattr(settings, name) for name in names})


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
