"""agentfast.yaml (or the file AGENTFAST_CONFIG names) as pydantic models, loaded and checked once per change.

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
A tool listed under tool_overrides is high risk and suspends unless its entry says
otherwise; a tool not listed is low risk and runs without asking anyone (`LISTED` and
`UNLISTED` below are the only place these defaults live). Risk is `low` or `high`.

The file's policy is a floor: an agent's own `tool_overrides`, and the definition a run
carries (Run.agent_config, the playground's composed agents), may add gates but never
remove or weaken them; `Policy.tool_policy` applies that for every caller.

Unknown keys are refused, and every error reads "<file>: <dotted.key>: <problem>".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from agents import text
from agents.notify.config import NotificationConfig

RISKS = ("low", "high")
MODES = ("suspend", "defer")
Risk = Literal["low", "high"]
Mode = Literal["suspend", "defer"]
MAX_TIMEOUT_SECONDS = 10 * 366 * 24 * 3600  # beyond this a deadline is a typo, and datetime overflows near it


class ConfigError(Exception):
    """agentfast.yaml is wrong; the message names the file, the key and the problem."""


def _problem(message: str) -> PydanticCustomError:
    # The message travels in the context so that braces in it are never taken for placeholders.
    return PydanticCustomError("agentfast", "{problem}", {"problem": message})


class _Entry(BaseModel):
    """A mapping of agentfast.yaml: unknown keys refused, a key with no value means its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # pydantic says "must be a mapping"
        allowed = sorted(cls.model_fields)
        for key in value:
            if key not in allowed:
                raise PydanticCustomError(
                    "unknown_key", "unknown key", {"key": str(key), "allowed": ", ".join(allowed)}
                )
        return {key: item for key, item in value.items() if item is not None}


class ToolPolicy(_Entry):
    """What the calls of one tool need; the defaults are those of a tool listed under tool_overrides."""

    risk: Risk = "high"
    hitl_mode: Mode = "suspend"
    timeout_seconds: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_SECONDS, strict=True, allow_inf_nan=False)] | None = (
        None
    )
    # The next keys (approvers, quorum, four_eyes, timeout, on_timeout, escalate_to,
    # remind_every, grants, rules) are a field each here, and a line each in `floor` below.

    @field_validator("risk", mode="before")
    @classmethod
    def _no_medium(cls, value: Any) -> Any:
        if value == "medium":
            raise _problem("'medium' is not a risk level: write high (a person decides) or low (it just runs)")
        return value

    @property
    def gated(self) -> bool:
        """Return whether a person must decide before the call runs."""
        return self.risk != "low"


LISTED = ToolPolicy()  # a tool under tool_overrides whose entry leaves the keys out
UNLISTED = ToolPolicy(risk="low")  # a tool nobody listed: it runs at once


class AgentConfig(_Entry):
    """An entry under `agents:`, or the definition a run carries."""

    model: StrictStr = "demo"
    system_prompt: StrictStr = ""
    tools: tuple[StrictStr, ...] = ()
    max_steps: Annotated[int, Field(strict=True, ge=1, le=1000)] = 10
    base_url: StrictStr | None = None
    description: StrictStr = ""
    tool_overrides: dict[StrictStr, ToolPolicy] = Field(default_factory=dict)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value != "demo" and not (value.startswith("openai:") and len(value) > len("openai:")):
            raise _problem(f"must be 'demo' or 'openai:<model name>', not {value!r}")
        return value


class AgentSpec(AgentConfig):
    """An agent as the runtime uses it: its entry and its name."""

    name: str


class ConfigFile(_Entry):
    """The whole file."""

    agents: dict[StrictStr, AgentConfig] = Field(default_factory=dict)
    tool_overrides: dict[StrictStr, ToolPolicy] = Field(default_factory=dict)
    notifications: list[NotificationConfig] = Field(default_factory=list)


def floor(file: ToolPolicy, own: ToolPolicy) -> ToolPolicy:
    """Combine the file's policy of a tool with an agent's own: either may gate it, neither may ungate it.

    Gated if either gates it; suspend if either gated one suspends (a suspended run cannot
    act on the call before the decision, a deferred one can); the file's deadline first.
    """
    gated = [policy for policy in (file, own) if policy.gated]
    if not gated:
        return file
    return ToolPolicy(
        risk="high",
        hitl_mode="suspend" if any(policy.hitl_mode == "suspend" for policy in gated) else "defer",
        timeout_seconds=next((policy.timeout_seconds for policy in gated if policy.timeout_seconds), None),
    )


@dataclass(frozen=True)
class Policy:
    path: Path
    agents: dict[str, AgentSpec] = field(default_factory=dict)
    tool_overrides: dict[str, ToolPolicy] = field(default_factory=dict)
    notifications: tuple[NotificationConfig, ...] = ()

    def tool_policy(self, tool_name: str, agent: AgentSpec | None = None) -> ToolPolicy:
        """Return what a tool's calls need for an agent: the file's policy, raised (never lowered) by the agent's."""
        file = self.tool_overrides.get(tool_name, UNLISTED)
        own = agent.tool_overrides.get(tool_name) if agent is not None else None
        return file if own is None else floor(file, own)

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
    agent = _agent(name, _validate(AgentConfig, spec, where), where)
    _check_tools_exist({name: agent}, {}, where, prefix="")
    return agent


def agent_for(name: str, config: dict[str, Any] | None) -> AgentSpec:
    """Return the agent a run uses: its own definition if it carries one, else the file's."""
    return agent_from_config(name, config) if config is not None else get_policy().agent(name)


def load(path: Path) -> Policy:
    """Read, parse and validate a config file."""
    try:
        content = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start} cannot be decoded)") from None
    try:
        raw = yaml.safe_load(content)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    return parse(raw, path)


def parse(raw: Any, path: Path) -> Policy:
    """Validate already-parsed YAML; every error names the file and the key."""
    config = _validate(ConfigFile, {} if raw is None else raw, path)
    agents = {name: _agent(name, entry, path) for name, entry in config.agents.items()}
    _check_tools_exist(agents, config.tool_overrides, path, prefix="agents.")
    return Policy(
        path=path, agents=agents, tool_overrides=config.tool_overrides, notifications=tuple(config.notifications)
    )


def _agent(name: str, entry: AgentConfig, path: Path) -> AgentSpec:
    return AgentSpec(name=name, **dict(entry))


def _validate(model: type[_Entry], raw: Any, path: Path) -> Any:
    try:
        validated = model.model_validate(raw)
    except ValidationError as exc:
        key, problem = _describe(exc.errors(include_url=False)[0])
        raise ConfigError(f"{path}: {key}: {problem}") from None
    found = text.problem(raw)
    if found:  # a NUL or a lone surrogate could not be stored with a run: refuse the file
        problem, _, key = found.removesuffix(")").rpartition(" (at ")
        raise ConfigError(f"{path}: {key}: {problem}" if problem else f"{path}: {found}")
    return validated


# A field's problem, said once for any way its value can be wrong.
_FIELD_PROBLEMS = {
    "tools": "must be a list of tool names",
    "max_steps": "must be a whole number from 1 to 1000",
    "timeout_seconds": f"must be a positive number of seconds, at most {MAX_TIMEOUT_SECONDS}",
    "system_prompt": "must be text",
    "description": "must be text",
    "base_url": "must be text",
    "model": "must be 'demo' or 'openai:<model name>'",
}


def _describe(error: Any) -> tuple[str, str]:
    """Translate one pydantic error into the dotted key it concerns and a problem in our words."""
    loc, kind, ctx, value = list(error["loc"]), error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "unknown_key":
        return _dotted([*loc, ctx["key"]]), f"unknown key (allowed: {ctx['allowed']})"
    if loc and loc[-1] == "[key]":
        return _dotted(loc[:-1]), f"names must be text, not {value!r}"
    if kind == "agentfast":
        return _dotted(loc), ctx["problem"]
    if kind == "literal_error":
        choices = ", ".join(re.findall(r"'([^']*)'", ctx.get("expected", "")))
        return _dotted(loc), f"must be one of {choices}, not {value!r}"
    names = [part for part in loc if isinstance(part, str)]
    if names and names[-1] in _FIELD_PROBLEMS:
        return _dotted(loc), _FIELD_PROBLEMS[names[-1]]
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return _dotted(loc), f"must be a mapping, not {type(value).__name__}"
    return _dotted(loc), error["msg"][:1].lower() + error["msg"][1:]


def _dotted(loc: list[Any]) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key or "(top level)"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Return the YAML error on one line, with its position."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if problem and mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def _check_tools_exist(
    agents: dict[str, AgentSpec], overrides: dict[str, ToolPolicy], path: Path, *, prefix: str
) -> None:
    from agents.tools.registry import registry

    def expect_registered(tool_name: str, key: str) -> None:
        if tool_name not in registry:
            raise ConfigError(f"{path}: {key}: unknown tool {tool_name!r} (registered: {', '.join(registry.names())})")

    for agent in agents.values():
        where = f"{prefix}{agent.name}." if prefix else ""
        for index, tool_name in enumerate(agent.tools):
            expect_registered(tool_name, f"{where}tools[{index}]")
        for tool_name in agent.tool_overrides:
            expect_registered(tool_name, f"{where}tool_overrides.{tool_name}")
    for tool_name in overrides:
        expect_registered(tool_name, f"tool_overrides.{tool_name}")
