"""One agent token holding many long-polls (GET /api/approvals/{id}/wait) at once."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

from tests.clients.conftest import Server

pytestmark = pytest.mark.integration
WAITS = 120


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_one_token_cannot_hold_a_server_thread_per_open_wait(server: Server) -> None:
    headers = {"Authorization": f"Bearer {server.agent_token}"}
    gated = httpx.post(
        f"{server.url}/api/gate",
        headers=headers,
        json={"agent": "a", "session": "s", "call_id": "c1", "tool": "wire_money", "arguments": {"cents": 5000}},
    )
    approval_id = gated.json()["approval_id"]
    pid = server.daphne.process.pid
    before = _threads(pid)
    seen: dict[str, int] = {}

    async def flood() -> list[int]:
        limits = httpx.Limits(max_connections=WAITS + 10)
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60, limits=limits) as client:

            async def one() -> int:
                r = await client.get(f"/api/approvals/{approval_id}/wait", params={"timeout": 6})
                return r.status_code

            tasks = [asyncio.ensure_future(one()) for _ in range(WAITS)]
            await asyncio.sleep(3)
            seen["during"] = _threads(pid)
            t0 = time.monotonic()
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as other:
                await other.get("/healthz")
            seen["healthz_ms"] = int((time.monotonic() - t0) * 1000)
            return await asyncio.gather(*tasks)

    statuses = asyncio.run(flood())
    assert statuses == [200] * WAITS  # each answered "still pending" at its timeout
    # SSE streams are capped at AGENTFAST_STREAMS_PER_USER (20) per user and share one thread;
    # a long-poll wait is neither: each open wait holds a thread of its own in the server.
    assert seen["during"] - before < 50, f"{seen['during'] - before} server threads for {WAITS} waits of one token"
