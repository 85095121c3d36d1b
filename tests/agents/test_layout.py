"""The engine never imports the dashboard (DESIGN.md's layout), as pyproject.toml's import-linter contract."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.processes import ROOT

LINT_IMPORTS = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Run `lint-imports` on the packages under `root` with `root`'s pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [*LINT_IMPORTS, "--no-cache", "pyproject.toml"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_it_keeps_the_engine_free_of_dashboard_imports():
    done = lint_imports(ROOT)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "The engine never imports the dashboard KEPT" in done.stdout


def test_it_breaks_the_contract_when_the_engine_imports_the_dashboard(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for package in ("agents", "dashboard"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "agents" / "cli.py").write_text("from dashboard import processes\n")
    (tmp_path / "dashboard" / "processes.py").write_text("")

    done = lint_imports(tmp_path)

    assert done.returncode == 1
    assert "The engine never imports the dashboard BROKEN" in done.stdout and "agents.cli -> dashboard" in done.stdout
