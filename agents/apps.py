from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Agents"

    def ready(self) -> None:
        # Fail at start, with the file, key and problem, rather than at the first run.
        from agents import policy
        from agents.policy.rules import register_grant_lookup
        from agents.services.grants import grant_match
        from agents.tools.registry import load_tool_modules

        load_tool_modules()
        policy.get_policy()
        # Remembered decisions take part in every evaluation: the driver's, the gate's, `policy check`.
        register_grant_lookup(grant_match)
