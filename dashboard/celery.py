"""The Celery application; tasks live in agents.tasks."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

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
