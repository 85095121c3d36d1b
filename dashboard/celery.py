"""The Celery application; tasks live in agents.tasks."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("agentfast")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["agents", "agents.notify"])
