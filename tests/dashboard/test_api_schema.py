"""Schemathesis against /api/openapi.json: generated requests, valid and invalid, find no 5xx
and no answer the schema does not describe. Bounded: 25 generated requests of each kind per operation
(about 20 seconds on 2 cores, most of it generating them).

Its negative_data_rejection check is left out: it counts unknown query parameters and a
query value of "null" as invalid input, which the API (like most) accepts; unknown body
fields and wrong types are refused, and test_api.py checks that.
"""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis
import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from schemathesis.checks import (
    content_type_conformance,
    ignored_auth,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import DataGenerationMethod
from schemathesis.models import Status
from schemathesis.runner import events, from_schema

from agents import services
from tests.support import flows

EXAMPLES_PER_OPERATION = 25


@pytest.fixture
def openapi_31() -> Iterator[None]:
    """Ninja writes OpenAPI 3.1, which schemathesis 3.x reads behind an experimental switch."""
    schemathesis.experimental.OPEN_API_3_1.enable()
    yield
    schemathesis.experimental.OPEN_API_3_1.disable()


@pytest.fixture
def wsgi_app(db: None) -> Iterator[WSGIHandler]:
    """The project as a WSGI app inside the test's transaction (as Django's test client runs it)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield WSGIHandler()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def test_it_survives_generated_requests_within_its_schema(openapi_31: None, wsgi_app: WSGIHandler, alice: User) -> None:
    token = services.token_create(username="alice")[1]
    flows.start("Refund order A1001 for 25.00 USD")  # something to list and show
    flows.start("Refund order Z9999 for 1.00 USD")
    schema = schemathesis.from_wsgi(
        "/api/openapi.json",
        wsgi_app,
        data_generation_methods=[DataGenerationMethod.positive, DataGenerationMethod.negative],
    ).exclude(tag="events")  # the SSE streams stay open; test_api_live.py covers them
    runner = from_schema(
        schema,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            ignored_auth,
        ],
        headers={"Authorization": f"Bearer {token}"},
        hypothesis_settings=hypothesis.settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,  # the same requests every run: CI fails for a change, not for luck
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        ),
    )
    failures = []
    operations = 0
    for event in runner.execute():
        if isinstance(event, events.AfterExecution):
            operations += 1
            failures += [
                f"{event.verbose_name}: {check.name}: {check.message} (query {check.example.query!r}, path {check.example.path_parameters!r}, body {check.example.body!r} → {check.response.status_code if check.response else None})"
                for check in event.result.checks
                if check.value == Status.failure
            ]
            failures += [f"{event.verbose_name}: {error.title}: {error.exception}" for error in event.result.errors]
        elif isinstance(event, events.InternalError):
            pytest.fail(f"schemathesis could not run: {event.title}: {event.message}")
    assert operations == 13  # 9 (extend among them), and the gate's 4 (dashboard/api/gateway.py)
    assert not failures, "\n".join(failures[:20])
