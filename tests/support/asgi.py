"""ASGI scopes for tests that call the HTTP application directly, as a server would."""

from __future__ import annotations

from typing import Any


def http_scope(path: str, headers: list[tuple[bytes, bytes]], *, method: str = "GET") -> dict[str, Any]:
    """Return the scope of a plain HTTP/1.1 request to testserver from 127.0.0.1."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
