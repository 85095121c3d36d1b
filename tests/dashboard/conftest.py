"""Fixtures of the dashboard tests: a user with no role, signed-in clients, a paused run."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents.models import Approval, Run
from tests.support.flows import pending, start

REFUND = "Refund order A1001 for 25.00 USD"
XSS = "Email bob@example.com that <img src=x onerror=alert(1)>"


@pytest.fixture
def dave(db: None) -> User:
    """A signed-up user with no role: may sign in, may see nothing."""
    return User.objects.create_user(username="dave", password="dave-password")


@pytest.fixture
def client_for() -> Callable[[User], Client]:
    """Return a test client signed in as the given user."""

    def make(user: User) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def paused(db: None) -> Run:
    """A support run paused on refund_request (25.00 USD for A1001)."""
    return start(REFUND)


@pytest.fixture
def approval(paused: Run) -> Approval:
    [approval] = pending(paused)
    return approval
