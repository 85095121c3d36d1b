"""`agentfast mcp-proxy --session` that no gated call can use: refused at start, as --name and --account are."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agents.models import Run
from tests.agents.test_mcp_gateway import AGENTFAST, UPSTREAM, _ran, ledger  # noqa: F401  (fixture)
from tests.conftest import child_env

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("session", ["   ", "s" * 201, "thread\x1b[31m"])
def test_it_refuses_at_start_a_session_no_call_could_be_gated_under(ledger: Path, session: str) -> None:  # noqa: F811
    """The proxy served, and answered every tool call with 'session is required' (or too long, or odd)."""
    args = [AGENTFAST, "mcp-proxy", "--upstream", UPSTREAM, "--session", session]
    done = subprocess.run(args, check=False, env=child_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL)

    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr.startswith("agentfast: --session") and done.stderr.count("\n") == 1, done.stderr
    assert _ran(ledger) == []
    assert not Run.objects.exists()
