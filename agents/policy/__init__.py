"""Which calls need whom: agentfast.yaml's agents and the policy of their tools (see config.py)."""

from __future__ import annotations

from agents.policy.config import (
    LISTED,
    MODES,
    RISKS,
    UNLISTED,
    AgentConfig,
    AgentSpec,
    ConfigError,
    ConfigFile,
    Policy,
    ToolPolicy,
    agent_for,
    agent_from_config,
    floor,
    get_policy,
    load,
    parse,
)

__all__ = [
    "LISTED",
    "MODES",
    "RISKS",
    "UNLISTED",
    "AgentConfig",
    "AgentSpec",
    "ConfigError",
    "ConfigFile",
    "Policy",
    "ToolPolicy",
    "agent_for",
    "agent_from_config",
    "floor",
    "get_policy",
    "load",
    "parse",
]
