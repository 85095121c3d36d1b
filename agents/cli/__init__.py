"""The engine's `agentfast` commands: approvals, runs, effects, users and tokens.

Every command calls the same services as the web and the API. Bad input exits non-zero
with one line on stderr and changes nothing. The site adds its process commands (`dev`,
`serve`, `worker`) through `main(extensions=…)`; the engine never imports the site.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agents import text
from agents.cli import approvals, audit, effects, grants, mcp, policy, runs, tokens, users
from agents.cli.output import EXIT_REFUSED, EXIT_USAGE, CliError, echo

__all__ = ["CliError", "build_parser", "main"]

_STATE_MUST_EXIST = "AGENTFAST_VAR_DIR_MUST_EXIST"  # read by the settings (dashboard/settings.py)

GROUPS: tuple[Callable[[Any], None], ...] = (
    approvals.register,
    runs.register,
    effects.register,
    users.register,
    tokens.register,
    policy.register,
    audit.register,
    grants.register,
    mcp.register,
)


def build_parser(extensions: Iterable[Callable[[Any], None]] = ()) -> argparse.ArgumentParser:
    """Return the parser of the engine's command groups plus those `extensions` register."""
    parser = argparse.ArgumentParser(prog="agentfast", description="Durable human approval for AI agents.")
    groups = parser.add_subparsers(title="commands", metavar="COMMAND")
    for register in (*GROUPS, *extensions):
        register(groups)
    return parser


def main(argv: Sequence[str] | None = None, *, extensions: Iterable[Callable[[Any], None]] = ()) -> int:
    """Run one command; return its exit status (1 with one line on stderr for any bad input)."""
    parser = build_parser(extensions)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra_args = extra
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_USAGE
    try:
        code = _run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader went away (`| head -1`): stop quietly, as the Python docs advise.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_REFUSED


def _run(args: argparse.Namespace) -> int:
    try:
        _require_clean_arguments(args)
        setup_django(existing_state=not getattr(args, "creates_state", False))
        return _dispatch(args)
    except CliError as exc:
        echo(f"agentfast: {exc}", err=True)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from django.db import DatabaseError

    from agents.services import ServiceError

    try:
        return args.handler(args) or 0
    except ServiceError as exc:
        raise CliError(exc.message) from None
    except text.UnsafeText as exc:
        raise CliError(exc.message) from None
    except DatabaseError as exc:
        raise CliError(f"database error: {exc} (is it migrated? `make run` migrates it)") from None


def _require_clean_arguments(args: argparse.Namespace) -> None:
    """Refuse arguments that are not valid text (invalid UTF-8 arrives as lone surrogates), naming the option."""
    for action in args.command_parser._actions:
        value = getattr(args, action.dest, None)
        name = action.option_strings[-1] if action.option_strings else action.dest.upper()
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and text.problem(item):
                raise CliError(f"{name}: {text.problem(item)}; nothing changed")
    for item in args.extra_args:
        if text.problem(item):
            raise CliError(f"{text.repair(item)}: {text.problem(item)}; nothing changed")


def setup_django(*, existing_state: bool = False) -> None:
    """Set Django up; report a bad settings value or config file in one line.

    With `existing_state` (every command but those that start the site's processes) the
    settings refuse a state folder (var/) that does not exist rather than create it empty.
    The variable is set for the settings' import alone: processes started later decide anew.
    """
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    import django
    from django.core.exceptions import ImproperlyConfigured

    from agents.policy import ConfigError

    if existing_state:
        os.environ[_STATE_MUST_EXIST] = "1"
    try:
        django.setup()
    except (ConfigError, ImproperlyConfigured) as exc:
        raise CliError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{_config_path()}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    finally:
        os.environ.pop(_STATE_MUST_EXIST, None)


def _config_path() -> str:
    from django.conf import settings

    named = os.environ.get("AGENTFAST_CONFIG", "").strip()
    return named or str(getattr(settings, "AGENTFAST_CONFIG", "agentfast.yaml"))
