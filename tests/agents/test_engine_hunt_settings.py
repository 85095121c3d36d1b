"""The worker's and the model's settings: a value the engine cannot use stops the process at start, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents import services, sweeper

ROOT = Path(__file__).resolve().parents[2]


def _import_settings(var_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Import the production settings in a fresh process with these variables (and none of ours) set."""
    return _fresh_process(var_dir, ["-c", "import django; django.setup()"], **env)


def _fresh_process(var_dir: Path, arguments: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """Run Python with these arguments in a fresh process with these variables (and none of ours) set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "AGENTFAST_", "REDIS_", "DATABASE_"))}
    clean = {k: v for k, v in clean.items() if not k.startswith("OPENAI_")}
    clean.update(DJANGO_SETTINGS_MODULE="dashboard.settings", AGENTFAST_VAR_DIR=str(var_dir), PYTHONPATH=str(ROOT))
    clean.update(env)
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=ROOT,
        check=False,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


# Each of these started, then failed every drive, sweep or model call with an OverflowError
# (a date past year 9999, a socket timeout past time_t): no run ever moved again.
@pytest.mark.parametrize(
    "variable",
    [
        "AGENTFAST_LEASE_SECONDS",
        "AGENTFAST_SWEEP_SECONDS",
        "AGENTFAST_SWEEP_GRACE_SECONDS",
        "AGENTFAST_EXTERNAL_CLAIM_SECONDS",
        "OPENAI_TIMEOUT",
        "OPENAI_TURN_TIMEOUT",
        "AGENTFAST_DEMO_DELAY_MS",
    ],
)
def test_it_refuses_a_duration_too_long_to_use_at_start_in_one_line(tmp_path: Path, variable: str) -> None:
    done = _import_settings(tmp_path / "var", **{variable: "1e300"})

    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert variable in last and "'1e300' is out of range" in last and "at most" in last


def test_it_refuses_so_many_model_retries_that_a_run_would_wait_on_a_dead_endpoint_for_months(tmp_path: Path) -> None:
    # Each retry waits up to 8 s: a million of them held the run, and its worker thread, for ever.
    done = _import_settings(tmp_path / "var", OPENAI_MAX_RETRIES="1000000")

    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "OPENAI_MAX_RETRIES" in last and "'1000000' is out of range (at least 0); at most 100" in last


@pytest.mark.parametrize("variable", ["AGENTFAST_LEASE_SECONDS", "OPENAI_TURN_TIMEOUT"])
def test_it_still_takes_a_day_long_duration(tmp_path: Path, variable: str) -> None:
    done = _import_settings(tmp_path / "var", **{variable: "86400"})

    assert done.returncode == 0, done.stderr


def test_it_leases_and_sweeps_with_the_longest_durations_it_takes(db: None, settings: Any) -> None:
    """Below the refusal, nothing overflows: the longest lease and grace the settings take still work."""
    from dashboard.settings import _ENGINE_SECONDS_MAX

    settings.AGENTFAST_LEASE_SECONDS = _ENGINE_SECONDS_MAX
    settings.AGENTFAST_SWEEP_GRACE_SECONDS = _ENGINE_SECONDS_MAX
    run = services.run_create(agent="support", input="Where is order A1001?", enqueue=False)

    assert services.run_lease(run_id=run.id, owner="w1") is not None
    assert sweeper.sweep().runs == []


@pytest.mark.parametrize("modules", ["acme_tols", "acme.tools,nope_module", "agents..tools", ".tools"])
def test_it_names_a_tool_module_it_cannot_import_in_one_line(tmp_path: Path, modules: str) -> None:
    # A typo here stopped every command, the web process and the worker with an import traceback.
    var = tmp_path / "var"
    var.mkdir()
    done = _fresh_process(var, ["-m", "agents.cli", "runs", "list"], AGENTFAST_TOOL_MODULES=modules)

    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("agentfast: AGENTFAST_TOOL_MODULES: ")
    assert "cannot be imported" in line
