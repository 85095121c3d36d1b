"""`python -m agents.cli`: the engine's commands alone (the console script adds the site's)."""

from __future__ import annotations

import sys

from agents.cli import main

sys.exit(main())
