"""Test settings: the project's settings with a private var/ and Redis of the test run.

The suite starts and stops its own Redis (the "Redis lost" test kills it), so it never
uses a REDIS_URL from the environment nor the Redis of a running `make run`.
"""

from __future__ import annotations

import os
from pathlib import Path

_VAR = Path(__file__).resolve().parent.parent / "var" / "test"
os.environ["AGENTFAST_VAR_DIR"] = str(_VAR)
os.environ.pop("REDIS_URL", None)

from dashboard.settings import *  # noqa: E402,F403

AGENTFAST_TOOL_MODULES = ["tests.support.tools"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
