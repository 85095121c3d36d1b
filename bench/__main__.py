from __future__ import annotations

from bench.main import main

raise SystemExit(main())
