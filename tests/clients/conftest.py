"""A running agentfast (daphne) with a policy, an agent account and a reviewer, for the clients' tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents import services
from agents.gateway import ids
from agents.models import Approval
from tests.conftest import child_env
from tests.support.processes import Daphne

POLICY = """
tool_overrides:
  wire_money:
    rules:
      - {name: huge, when: "args.cents > 100000", action: deny, reason: "wires over 1,000.00 need a ticket"}
"""


@dataclass
class Server:
    """The running agentfast and the tokens of its agent account and of a reviewer."""

    url: str
    agent_token: str
    reviewer_token: str
    daphne: Daphne

    def approval_id(self, *, agent: str, session: str, call_id: str) -> str:
        return ids.approval_id(owner="robot", agent=agent, session=session, external_call_id=call_id)

    def await_pending(self, approval_id: str, *, within: float = 60) -> None:
        """Block until the approval exists (the client has gated it); fail after `within` seconds."""
        deadline = time.monotonic() + within
        while not Approval.objects.filter(pk=approval_id, status=Approval.Status.PENDING).exists():
            assert time.monotonic() < deadline, f"{approval_id} was never gated"
            time.sleep(0.05)

    def decide(self, approval_id: str, decision: str, note: str = "", **words: Any) -> None:
        """Decide as a reviewer, over the HTTP API; `words`: feedback, payload."""
        response = httpx.post(
            f"{self.url}/api/approvals/{approval_id}/decide",
            json={"decision": decision, "note": note, **words},
            headers={"Authorization": f"Bearer {self.reviewer_token}"},
        )
        assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def _daphne(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    """One daphne with POLICY per test module (a start costs seconds); each test empties the database."""
    folder = tmp_path_factory.mktemp("daphne")
    (folder / "agentfast.yaml").write_text(POLICY)
    daphne = Daphne(
        log=folder / "daphne.log",
        env=child_env(
            DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
            AGENTFAST_LOG_LEVEL="WARNING",
            AGENTFAST_CONFIG=str(folder / "agentfast.yaml"),
        ),
    )
    daphne.start()
    daphne.wait_ready(timeout=20)
    yield daphne
    daphne.kill()


@pytest.fixture
def server(transactional_db: None, _daphne: Daphne, agent_config: Callable[[str], Path], alice: Any) -> Server:
    agent_config(POLICY)  # this process's engine reads the same policy as the server
    services.user_create(username="robot", role="agent")
    agent_token = services.token_create(username="robot")[1]
    reviewer_token = services.token_create(username="alice")[1]
    _daphne.ensure_running()  # an earlier test may have killed it
    return Server(_daphne.url, agent_token, reviewer_token, _daphne)


@pytest.fixture(scope="session")
def openai_agents_python() -> Path:
    """Return the Python of a virtualenv with the client and the OpenAI Agents SDK, built once and kept.

    The SDK's package is named `agents`, like agentfast's engine, so it cannot live in the
    project's environment: it gets its own, under var/ (rebuilt when the client's pyproject changes).
    """
    import fcntl
    import hashlib
    import subprocess
    import sys

    from tests.support.processes import ROOT

    client = ROOT / "clients" / "python"
    stamp_text = hashlib.sha256((client / "pyproject.toml").read_bytes()).hexdigest()
    venv = ROOT / "var" / "openai-agents-venv"
    python, stamp = venv / "bin" / "python", venv / ".installed"
    venv.parent.mkdir(parents=True, exist_ok=True)
    # pytest-xdist workers may all get here at once: one builds, the others wait for it.
    with (venv.parent / "openai-agents-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (python.exists() and stamp.exists() and stamp.read_text() == stamp_text):
            uv = [sys.executable, "-m", "uv", "--quiet"]
            subprocess.run([*uv, "venv", "--clear", "--python", sys.executable, str(venv)], check=True)
            install = [*uv, "pip", "install", "--python", str(python)]
            subprocess.run([*install, "-e", f"{client}[openai-agents]"], check=True, timeout=600)
            stamp.write_text(stamp_text)
    return python
