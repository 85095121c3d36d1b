"""The Celery application: its configuration comes from Django's settings, and its Redis channels reuse a client."""

from __future__ import annotations

import json

import redis
from django.conf import settings

from dashboard.celery import app


def test_it_is_configured_from_every_celery_setting_of_django():
    names = [name for name in dir(settings) if name.startswith("CELERY_")]

    assert "CELERY_BROKER_URL" in names and "CELERY_TASK_ACKS_LATE" in names
    for name in names:
        assert app.conf[name.removeprefix("CELERY_").lower()] == getattr(settings, name), name
    assert app.conf.task_default_priority is None  # a setting Django does not name keeps Celery's default
    # Read as Celery 3's names, CELERY_TASK_SERIALIZER and two more made every worker start warn.
    assert not app.conf.deprecated_settings
    assert not app.conf.maybe_warn_deprecated_settings()


def test_a_redis_channel_sends_its_commands_through_one_client_on_its_pool(redis_server):
    queue = "agentfast-test-shared-client"
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        client = channel._create_client()

        assert channel._create_client() is client and client.connection_pool is channel.pool
        channel._put(queue, {"body": "one"})
        channel._put(queue, {"body": "two"})
        assert [json.loads(m)["body"] for m in client.lrange(queue, 0, -1)] == ["two", "one"]

        channel._pool = None  # as kombu leaves it when it lets a lost connection's pool go
        replaced = channel._create_client()

        assert replaced is not client and replaced.connection_pool is channel.pool
        assert replaced.llen(queue) == 2
        replaced.delete(queue)
        # the BRPOP client stays the channel's own: kombu registers its connection with the event loop
        assert isinstance(channel.client, redis.Redis) and channel.client is not replaced
