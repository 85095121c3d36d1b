from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Agents"

    def ready(self) -> None:
        # Fail at start, with the file, key and problem, rather than at the first run.
        from agents import policy
        from agents.tools.registry import load_tool_modules

        load_tool_modules()
        policy.get_policy()
