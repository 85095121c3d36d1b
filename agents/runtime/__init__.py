from __future__ import annotations

from agents.runtime.driver import DriveResult, drive, owner_name

__all__ = ["DriveResult", "drive", "owner_name"]
