"""Agents and tool risk, read from agentfast.yaml (or the file AGENTFAST_CONFIG names).

```yaml
agents:
  support:
    model: demo                 # or "openai:<model name>"
    system_prompt: You are …
    tools: [lookup_order, refund_request]
    max_steps: 10
tool_overrides:
  refund_request: {risk: high, hitl_mode: suspend}
  send_email:     {risk: high, hitl_mode: defer}
```
A tool not listed under tool_overrides is low risk and runs without asking anyone. An agent
may carry its own `tool_overrides`, which win over these for its runs.

A run may also carry its own agent definition (Run.agent_config, the same keys as an
entry under `agents:`): the playground's composed agents travel with their runs, so any
worker on any machine can drive them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

RISKS = ("low", "medium", "high")
MODES = ("suspend", "defer")
_AGENT_KEYS = {"model", "system_prompt", "tools", "max_steps", "base_url", "description", "tool_overrides"}
_TOOL_KEYS = {"risk", "hitl_mode", "timeout_seconds"}


class ConfigError(Exception):
    """agentfast.yaml is wrong; the message names the file, the key and the problem."""


@dataclass(frozen=True)
class ToolPolicy:
    risk: str = "low"
    hitl_mode: str = "suspend"
    timeout_seconds: float | None = None

    @property
    def gated(self) -> bool:
        """Return whether a person must decide before the call runs."""
        return self.risk != "low"


@dataclass(frozen=True)
class AgentSpec:
    name: str
    model: str = "demo"
    system_prompt: str = ""
    tools: tuple[str, ...] = ()
    max_steps: int = 10
    base_url: str | None = None
    description: str = ""
    # This agent's own risk settings; they win over the file's tool_overrides.
    tool_overrides: dict[str, ToolPolicy] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Policy:
    path: Path
    agents: dict[str, AgentSpec] = field(default_factory=dict)
    tool_overrides: dict[str, ToolPolicy] = field(default_factory=dict)

    def tool_policy(self, tool_name: str, agent: AgentSpec | None = None) -> ToolPolicy:
        """Return the risk policy of a tool (the agent's own first); unlisted tools are low risk."""
        if agent is not None and tool_name in agent.tool_overrides:
            return agent.tool_overrides[tool_name]
        return self.tool_overrides.get(tool_name, ToolPolicy())

    def agent(self, name: str) -> AgentSpec:
        try:
            return self.agents[name]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise ConfigError(f"unknown agent {name!r} (configured in {self.path}: {known})") from None


_cache: dict[tuple[str, float], Policy] = {}


def get_policy() -> Policy:
    """Return the policy of the configured file, re-read when the file changes."""
    path = Path(os.environ.get("AGENTFAST_CONFIG") or settings.AGENTFAST_CONFIG)
    try:
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from None
    key = (str(path), mtime)
    if key not in _cache:
        _cache.clear()
        _cache[key] = load(path)
    return _cache[key]


def agent_from_config(name: str, spec: Any) -> AgentSpec:
    """Validate an agent defined for one run (the playground's), keyed like an agentfast.yaml entry."""
    where = Path(f"<the agent of this run, {name}>")
    agent = _agent(name, spec, where)
    _check_tools_exist({name: agent}, {}, where)
    return agent


def agent_for(name: str, config: dict[str, Any] | None) -> AgentSpec:
    """Return the agent a run uses: its own definition if it carries one, else the file's."""
    return agent_from_config(name, config) if config is not None else get_policy().agent(name)


def load(path: Path) -> Policy:
    """Parse and validate a config file."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse(raw, path)


def parse(raw: Any, path: Path) -> Policy:
    """Validate already-parsed YAML; every error names the file and the key."""
    _expect(isinstance(raw, dict), path, "(top level)", "must be a mapping")
    _no_unknown(raw, {"agents", "tool_overrides"}, path, "")
    overrides = {
        str(name): _tool_policy(spec, path, f"tool_overrides.{name}")
        for name, spec in _mapping(raw.get("tool_overrides"), path, "tool_overrides").items()
    }
    agents = {
        str(name): _agent(str(name), spec, path) for name, spec in _mapping(raw.get("agents"), path, "agents").items()
    }
    _check_tools_exist(agents, overrides, path)
    return Policy(path=path, agents=agents, tool_overrides=overrides)


def _tool_policy(spec: Any, path: Path, key: str) -> ToolPolicy:
    spec = _mapping(spec, path, key)
    _no_unknown(spec, _TOOL_KEYS, path, key)
    risk = spec.get("risk", "high")
    _expect(risk in RISKS, path, f"{key}.risk", f"must be one of {', '.join(RISKS)}, not {risk!r}")
    mode = spec.get("hitl_mode", "suspend")
    _expect(mode in MODES, path, f"{key}.hitl_mode", f"must be one of {', '.join(MODES)}, not {mode!r}")
    timeout = spec.get("timeout_seconds")
    _expect(
        timeout is None or (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0),
        path,
        f"{key}.timeout_seconds",
        "must be a positive number of seconds",
    )
    return ToolPolicy(risk=risk, hitl_mode=mode, timeout_seconds=timeout)


def _agent(name: str, spec: Any, path: Path) -> AgentSpec:
    key = f"agents.{name}"
    spec = _mapping(spec, path, key)
    _no_unknown(spec, _AGENT_KEYS, path, key)
    model = spec.get("model", "demo")
    _expect(
        isinstance(model, str) and (model == "demo" or (model.startswith("openai:") and len(model) > 7)),
        path,
        f"{key}.model",
        f"must be 'demo' or 'openai:<model name>', not {model!r}",
    )
    tools = spec.get("tools", [])
    _expect(
        isinstance(tools, list) and all(isinstance(t, str) for t in tools),
        path,
        f"{key}.tools",
        "must be a list of tool names",
    )
    max_steps = spec.get("max_steps", 10)
    _expect(
        isinstance(max_steps, int) and not isinstance(max_steps, bool) and 1 <= max_steps <= 1000,
        path,
        f"{key}.max_steps",
        "must be a whole number from 1 to 1000",
    )
    for text_key in ("system_prompt", "base_url", "description"):
        value = spec.get(text_key)
        _expect(value is None or isinstance(value, str), path, f"{key}.{text_key}", "must be text")
    return AgentSpec(
        name=name,
        model=model,
        system_prompt=spec.get("system_prompt") or "",
        tools=tuple(tools),
        max_steps=max_steps,
        base_url=spec.get("base_url"),
        description=spec.get("description") or "",
        tool_overrides={
            str(tool): _tool_policy(rule, path, f"{key}.tool_overrides.{tool}")
            for tool, rule in _mapping(spec.get("tool_overrides"), path, f"{key}.tool_overrides").items()
        },
    )


def _check_tools_exist(agents: dict[str, AgentSpec], overrides: dict[str, ToolPolicy], path: Path) -> None:
    from agents.tools.registry import registry

    for agent in agents.values():
        for index, tool_name in enumerate(agent.tools):
            _expect(
                tool_name in registry,
                path,
                f"agents.{agent.name}.tools[{index}]",
                f"unknown tool {tool_name!r} (registered: {', '.join(registry.names())})",
            )
    keys = [f"tool_overrides.{tool}" for tool in overrides]
    keys += [f"agents.{agent.name}.tool_overrides.{tool}" for agent in agents.values() for tool in agent.tool_overrides]
    for key in keys:
        tool_name = key.rsplit(".", 1)[1]
        _expect(
            tool_name in registry, path, key, f"unknown tool {tool_name!r} (registered: {', '.join(registry.names())})"
        )


def _mapping(value: Any, path: Path, key: str) -> dict[Any, Any]:
    if value is None:
        return {}
    _expect(isinstance(value, dict), path, key, f"must be a mapping, not {type(value).__name__}")
    return value


def _no_unknown(spec: dict[Any, Any], allowed: set[str], path: Path, key: str) -> None:
    unknown = sorted(str(k) for k in spec if k not in allowed)
    where = f"{key}.{unknown[0]}" if key and unknown else (unknown[0] if unknown else key)
    _expect(not unknown, path, where, f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _expect(condition: bool, path: Path, key: str, problem: str) -> None:
    if not condition:
        raise ConfigError(f"{path}: {key}: {problem}")
