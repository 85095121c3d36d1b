"""The engine never imports the dashboard (DESIGN.md's layout)."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "agents"


def test_it_keeps_the_engine_free_of_dashboard_imports():
    offenders = []
    for path in ENGINE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(ENGINE.parent)}: {name}" for name in names if name.split(".")[0] == "dashboard"
            ]

    assert offenders == []
