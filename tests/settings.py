"""Test settings: the project's settings with a private var/ and Redis of the test run.

The suite starts and stops its own Redis (the "Redis lost" test kills it), so it never
uses a REDIS_URL from the environment nor the Redis of a running `make run`.
"""

from __future__ import annotations

import os
from pathlib import Path

# One folder per test run (its Redis socket and SQLite files), so two runs side by side
# never share a database or stop each other's Redis; worker processes inherit it.
_RUN_DIR = Path(__file__).resolve().parent.parent / "var" / "test" / str(os.getpid())
os.environ.setdefault("AGENTFAST_TEST_VAR_DIR", str(_RUN_DIR))
# pytest-xdist: each worker inherits the controller's folder; it takes a subfolder of its own
# (its Redis, its SQLite files), which the worker's own child processes inherit unchanged.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _XDIST_WORKER and Path(os.environ["AGENTFAST_TEST_VAR_DIR"]).name != _XDIST_WORKER:
    os.environ["AGENTFAST_TEST_VAR_DIR"] = str(Path(os.environ["AGENTFAST_TEST_VAR_DIR"]) / _XDIST_WORKER)
os.environ["AGENTFAST_VAR_DIR"] = os.environ["AGENTFAST_TEST_VAR_DIR"]
os.environ.pop("REDIS_URL", None)

from dashboard.settings import *  # noqa: E402,F403

AGENTFAST_TOOL_MODULES = ["tests.support.tools"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
# Threads of the test process (the lease keeper, SSE drives) close their connections after
# each use, so none is left open on the test database when it is dropped.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
