"""`agentfast serve` and `worker` given variables the settings take: the process starts as the settings read them."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from agents import cli
from dashboard import processes


def _exec_argv(monkeypatch: pytest.MonkeyPatch, command: Any, args: argparse.Namespace) -> list[str]:
    """Return the command line the process command would exec (nothing is exec'd, nothing is said)."""
    seen: list[list[str]] = []
    monkeypatch.setattr(processes, "_say_configuration_problems", lambda: None)
    monkeypatch.setattr(processes, "raise_open_files_limit", lambda: 0)
    monkeypatch.setattr(processes.os, "execvp", lambda file, argv: seen.append(list(argv)))
    command(args)
    return seen[0]


@pytest.mark.parametrize("value", [" info", "info ", "\tINFO\n"])
def test_the_worker_starts_at_a_log_level_the_settings_took(monkeypatch, value):
    # The settings read AGENTFAST_LOG_LEVEL without its blanks (" info" is INFO, in any case);
    # the worker passed it on as written, and celery refused to start:
    # "Invalid value for '--loglevel': ' INFO' is not one of 'DEBUG', 'INFO', …".
    monkeypatch.setenv("AGENTFAST_LOG_LEVEL", value)

    argv = _exec_argv(monkeypatch, processes._worker, argparse.Namespace(extra_args=[]))

    assert "--loglevel=INFO" in argv


def test_serve_logs_at_the_level_the_settings_took(monkeypatch):
    monkeypatch.setenv("AGENTFAST_LOG_LEVEL", " info ")

    argv = _exec_argv(monkeypatch, processes._serve, argparse.Namespace(host="127.0.0.1", port=8321))

    assert argv[argv.index("-v") + 1] == "1"  # daphne's access log, as AGENTFAST_LOG_LEVEL=INFO gives it


@pytest.mark.parametrize(("value", "host"), [("  ", "127.0.0.1"), ("0.0.0.0 ", "0.0.0.0"), (" ::1", "::1")])
def test_serve_listens_where_a_host_with_blanks_around_it_says(monkeypatch, value, host):
    # AGENTFAST_PORT=" 8321 " is read without its blanks; AGENTFAST_HOST was not: daphne failed
    # with "Couldn't listen on 0.0.0.0 :8321", and a blank one is no address at all.
    monkeypatch.setenv("AGENTFAST_HOST", value)

    args = cli.build_parser([processes.register]).parse_args(["serve"])

    assert args.host == host
