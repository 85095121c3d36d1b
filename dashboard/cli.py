"""The `agentfast` console script: the engine's command groups plus the site's process commands."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from agents import cli
from dashboard import processes


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `agentfast` command."""
    return cli.main(argv, extensions=[processes.register])


if __name__ == "__main__":
    sys.exit(main())
