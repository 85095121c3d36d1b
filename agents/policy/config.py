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

import difflib
import hashlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal

import yaml
from django.conf import settings
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from agents import text
from agents.notify.config import NotificationConfig, WebhookChannel

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


Action = Literal["allow", "deny", "ask", "schedule"]
USER_PREFIX = "user:"
AGENT_ROLE = "agent"  # the role group of agents' accounts, which never decide


def _approver(name: str) -> str:
    """Refuse a name no group or user can have (names are stored without surrounding blanks): nobody could approve."""
    person = name.removeprefix(USER_PREFIX)
    if not person.strip():
        raise _problem(f"{name!r} names no one: give a group name or {USER_PREFIX}NAME (nobody could approve)")
    if person != person.strip():
        raise _problem(f"{name!r} has blanks around the name, which no group or user has (nobody could approve)")
    if name == AGENT_ROLE:
        raise _problem(f"{name!r} is the group of agents' accounts, which never decide (nobody could approve)")
    return name


# Who may decide, or is escalated to: Django group names, or "user:NAME".
Approvers = tuple[Annotated[str, Field(strict=True, max_length=150), AfterValidator(_approver)], ...]
# Distinct approvers of the same arguments. A rule's as well as a tool's: a rule asking 30 (a typo)
# made calls nobody could approve, which an `on_timeout: approve` then ran at their deadline.
Quorum = Annotated[int, Field(strict=True, ge=1, le=20)]
OnTimeout = Literal["reject", "approve", "escalate"]
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION_PROBLEM = "must be a duration like 90s, 30m, 4h or 2d (or a number of seconds)"


def parse_duration(value: Any) -> float:
    """Return the seconds of a duration ("90s", "30m", "4h", "2d", or a number); raise ValueError or TypeError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(DURATION_PROBLEM)
    if isinstance(value, str):
        found = _DURATION.match(value)
        if found is None:
            raise ValueError(DURATION_PROBLEM)
        value = float(found.group(1)) * _UNIT_SECONDS[found.group(2)]
    if not 0 < value <= MAX_TIMEOUT_SECONDS:
        raise ValueError(f"must be positive and at most {MAX_TIMEOUT_SECONDS} seconds")
    return float(value)


def _duration(value: Any) -> float:
    try:
        return parse_duration(value)
    except (ValueError, TypeError) as exc:
        raise _problem(str(exc)) from None


Duration = Annotated[float, BeforeValidator(_duration)]


class _Deadline(_Entry):
    """The deadline keys a tool and its ask rules share: when, what then, whom to escalate to, reminders."""

    timeout: Duration | None = None
    on_timeout: OnTimeout | None = None
    escalate_to: Approvers | None = None
    remind_every: Duration | None = None

    def _deadline_problem(self, timeout: float | None) -> str:
        if self.on_timeout == "escalate" and not self.escalate_to:
            return "on_timeout: escalate needs escalate_to (the groups or user:NAME to escalate to)"
        if self.escalate_to and self.on_timeout != "escalate":
            return "escalate_to belongs with on_timeout: escalate"
        if self.on_timeout not in (None, "reject") and timeout is None:
            return f"on_timeout: {self.on_timeout} needs a timeout (it never fires without one)"
        return ""


class Rule(_Deadline):
    """One rule of a tool: when its CEL condition holds, allow, deny (with a reason), ask, or schedule.

    An ask rule may carry its own deadline keys; a schedule rule's `at` (CEL) gives the time the call runs.
    """

    name: Annotated[str, Field(strict=True, min_length=1, max_length=100)]
    when: StrictStr = "true"
    action: Action
    reason: StrictStr = ""
    approvers: Approvers | None = None
    quorum: Quorum | None = None
    at: StrictStr | None = None

    @field_validator("when", "at")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        problem = cel_problem(value) if value is not None else ""
        if problem:
            raise _problem(problem)
        return value

    @model_validator(mode="after")
    def _keys_fit_action(self) -> Rule:
        if self.action != "ask" and (self.approvers is not None or self.quorum is not None):
            raise _problem(f"approvers and quorum belong to ask rules, not to a {self.action} rule")
        deadline = (self.timeout, self.on_timeout, self.escalate_to, self.remind_every)
        if self.action != "ask" and any(key is not None for key in deadline):
            raise _problem(f"timeout, on_timeout, escalate_to and remind_every belong to ask rules, not {self.action}")
        if self.reason and self.action != "deny":
            raise _problem("reason belongs to deny rules (it is what the model is told)")
        if (self.action == "schedule") != (self.at is not None):
            raise _problem("a schedule rule needs `at` (a CEL timestamp), and `at` belongs to schedule rules only")
        problem = self._deadline_problem(self.timeout)
        if problem:
            raise _problem(problem)
        return self

    @property
    def at_program(self) -> Any:
        """Return the compiled `at` expression of a schedule rule."""
        return compile_cel(self.at or "now")

    @property
    def program(self) -> Any:
        """Return the compiled condition (compiled once per expression, at load)."""
        return compile_cel(self.when)


# The keys of a tool's entry that say who decides its calls and by when.
_DECIDING_KEYS = frozenset(
    {"approvers", "quorum", "four_eyes", "timeout", "timeout_seconds", "on_timeout", "escalate_to", "remind_every"}
)


class ToolPolicy(_Deadline):
    """What the calls of one tool need; the defaults are those of a tool listed under tool_overrides."""

    risk: Risk = "high"
    hitl_mode: Mode = "suspend"
    timeout_seconds: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_SECONDS, strict=True, allow_inf_nan=False)] | None = (
        None
    )
    approvers: Approvers = ()  # empty means any reviewer
    quorum: Quorum = 1
    four_eyes: Annotated[bool, Field(strict=True)] = False  # whoever started the run may not approve its calls
    grants: Annotated[bool, Field(strict=True)] = True
    rules: tuple[Rule, ...] = ()
    # timeout (timeout_seconds is its older name), on_timeout, escalate_to and remind_every come
    # from _Deadline; `floor` below combines them.

    @field_validator("risk", mode="before")
    @classmethod
    def _no_medium(cls, value: Any) -> Any:
        if value == "medium":
            raise _problem("'medium' is not a risk level: write high (a person decides) or low (it just runs)")
        return value

    @model_validator(mode="after")
    def _deadline_fits(self) -> ToolPolicy:
        if self.timeout is not None and self.timeout_seconds is not None and self.timeout != self.timeout_seconds:
            raise _problem("timeout_seconds is the older name of timeout: give one of them")
        problem = self._deadline_problem(self.deadline_seconds)
        if problem:
            raise _problem(problem)
        ignored = sorted(self.model_fields_set & _DECIDING_KEYS)
        if self.risk == "low" and ignored and not any(rule.action == "ask" for rule in self.rules):
            # Every call runs at once: approvers or a deadline beside it read as a gate that is not there.
            raise _problem(
                f"{', '.join(ignored)} would never apply: with risk: low every call runs without asking anyone "
                "(write risk: high, or an ask rule they apply to)"
            )
        return self

    @property
    def deadline_seconds(self) -> float | None:
        """Return the deadline in seconds (timeout, or its older name timeout_seconds), or None."""
        return self.timeout if self.timeout is not None else self.timeout_seconds

    @field_validator("rules")
    @classmethod
    def _unique_names(cls, rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
        seen: set[str] = set()
        for rule in rules:
            if rule.name in seen:
                raise _problem(f"two rules are named {rule.name!r}: each rule of a tool needs its own name")
            seen.add(rule.name)
        return rules

    @property
    def gated(self) -> bool:
        """Return whether a person must decide before the call runs."""
        return self.risk != "low"


LISTED = ToolPolicy()  # a tool under tool_overrides whose entry leaves the keys out
UNLISTED = ToolPolicy(risk="low")  # a tool nobody listed: it runs at once


MAX_NAME_CHARS = 100  # Run.agent and Approval.tool hold this many


def _short_names(entries: dict[str, Any]) -> dict[str, Any]:
    """Refuse a name longer than a run or an approval holds: the agent could never start, the tool never be gated."""
    for name in entries:
        if len(name) > MAX_NAME_CHARS:
            raise _problem(f"the name {name[:40]!r}… has {len(name)} characters: at most {MAX_NAME_CHARS} characters")
    return entries


class AgentConfig(_Entry):
    """An entry under `agents:`, or the definition a run carries."""

    model: StrictStr = "demo"
    system_prompt: StrictStr = ""
    tools: tuple[StrictStr, ...] = ()
    max_steps: Annotated[int, Field(strict=True, ge=1, le=1000)] = 10
    base_url: StrictStr | None = None
    description: StrictStr = ""
    tool_overrides: dict[StrictStr, ToolPolicy] = Field(default_factory=dict)

    _tool_names = field_validator("tool_overrides")(_short_names)

    @field_validator("base_url")
    @classmethod
    def _http_base_url(cls, value: str | None) -> str | None:
        # Without a scheme (or with blanks around it) every request failed with the SDK's "Connection error.".
        if value is not None and not re.fullmatch(r"https?://[^\s/?#]+(/\S*)?", value):
            raise _problem(f"must be an http(s) URL like https://api.example.com/v1, not {value!r}")
        return value

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
    # `mcp: {SERVER: {TOOL: …}}`: the tools `agentfast mcp-proxy` serves, as policy tool `mcp.SERVER.TOOL`.
    mcp: dict[StrictStr, dict[StrictStr, ToolPolicy]] = Field(default_factory=dict)

    _names = field_validator("agents", "tool_overrides")(_short_names)

    @field_validator("notifications")
    @classmethod
    def _one_secret_a_url(cls, entries: list[NotificationConfig]) -> list[NotificationConfig]:
        # A delivery finds its secret by its URL: a second entry for one URL would be signed with the first's.
        seen: dict[str, int] = {}
        for index, entry in enumerate(entries):
            if isinstance(entry, WebhookChannel):
                if entry.url in seen:
                    raise ValueError(
                        f"notifications[{index}] repeats the url of notifications[{seen[entry.url]}]: "
                        "one webhook entry a URL (list every event it wants in its events:)"
                    )
                seen[entry.url] = index
        return entries


def floor(file: ToolPolicy, own: ToolPolicy) -> ToolPolicy:
    """Combine the file's policy of a tool with an agent's own: either may gate it, neither may ungate it.

    Gated if either gates it; suspend if either gated one suspends (a suspended run cannot
    act on the call before the decision, a deferred one can); the file's deadline first
    (an agent's own deadline may reject or escalate, never approve: that would ungate the call).
    The rules are the file's alone (an agent's own entry may not carry any), and either
    may turn remembered decisions off.
    """
    gated = [policy for policy in (file, own) if policy.gated]
    grants = file.grants and own.grants
    if not gated:
        return file if grants == file.grants else file.model_copy(update={"grants": grants})
    # A low-risk file tool whose ask (or schedule) rule asks a person: its keys say how that ask
    # is decided (mode, quorum, four eyes, deadline), so they count as a gated entry's would.
    file_asks = file.gated or any(rule.action in ("ask", "schedule") for rule in file.rules)
    if file_asks and not file.gated:
        gated = [file, *gated]
    # A file ask rule's own quorum never lowers the agent's (as evaluate() says): raised here, so
    # that whatever reads the rules (a grant checked again, rules.asked) sees the same quorum.
    raised = own.quorum if own.gated else 1
    rules = tuple(
        rule.model_copy(update={"quorum": raised})
        if rule.action == "ask" and rule.quorum is not None and rule.quorum < raised
        else rule
        for rule in file.rules
    )
    return file.model_copy(
        update={
            "risk": "high",
            "hitl_mode": "suspend" if any(policy.hitl_mode == "suspend" for policy in gated) else "defer",
            **_deadline_of(file if file_asks and file.deadline_seconds else own if own.gated else file, file),
            # Who may decide is the file's to say (an agent narrowing it to itself would be a
            # way around it); the agent may only ask for more approvers or for four eyes.
            "approvers": file.approvers or own.approvers,
            "quorum": max(policy.quorum for policy in gated),
            "four_eyes": any(policy.four_eyes for policy in gated),
            "grants": grants,
            "rules": rules,
        }
    )


def _deadline_of(policy: ToolPolicy, file: ToolPolicy) -> dict[str, Any]:
    """Return the deadline keys of the policy that sets the deadline; an agent's may not approve.

    Nor may an agent's deadline escalate where the file names who decides (the tool's approvers
    or an ask rule's): escalation adds its `escalate_to` as approvers, which would let people
    decide that the file did not name. There it rejects instead.
    """
    on_timeout, escalate_to = policy.on_timeout, policy.escalate_to
    if policy is not file and on_timeout == "approve":
        on_timeout = "reject"
    if policy is not file and on_timeout == "escalate" and _names_deciders(file):
        on_timeout, escalate_to = "reject", None
    return {
        "timeout": policy.timeout,
        "timeout_seconds": policy.timeout_seconds,
        "on_timeout": on_timeout,
        "escalate_to": escalate_to,
        "remind_every": policy.remind_every,
    }


def _names_deciders(policy: ToolPolicy) -> bool:
    """Return whether a tool's policy narrows who decides (its approvers, or an ask rule's)."""
    return bool(policy.approvers) or any(rule.approvers for rule in policy.rules)


@dataclass(frozen=True)
class Policy:
    path: Path
    agents: dict[str, AgentSpec] = field(default_factory=dict)
    tool_overrides: dict[str, ToolPolicy] = field(default_factory=dict)
    version: str = ""  # a short sha256 of the file's bytes: what an approval records as the policy that asked
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
            # The file's name, not its path: the message reaches API callers, who have no business with the server's folders.
            raise ConfigError(f"unknown agent {name!r} ({self.path.name} configures: {known})") from None


_cache: dict[tuple[str, float], Policy] = {}


def get_policy() -> Policy:
    """Return the policy of the configured file, re-read when the file changes."""
    path = Path(os.environ.get("AGENTFAST_CONFIG", "").strip() or settings.AGENTFAST_CONFIG)
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
    _check_no_agent_rules({name: agent}, where, prefix="")
    return agent


def agent_for(name: str, config: dict[str, Any] | None) -> AgentSpec:
    """Return the agent a run uses: its own definition if it carries one, else the file's."""
    return agent_from_config(name, config) if config is not None else get_policy().agent(name)


def load(path: Path) -> Policy:
    """Read, parse and validate a config file."""
    try:
        data = path.read_bytes()
        content = data.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start} cannot be decoded)") from None
    try:
        raw = _safe_load_unique(content)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:  # PyYAML composes a node by recursion: thousands of nested brackets exhaust the stack
        raise ConfigError(
            f"{path}: not valid YAML: nested too deeply to read (lists or mappings inside each other)"
        ) from None
    return parse(raw, path, version=policy_version(data))


def _safe_load_unique(content: str) -> Any:
    """Parse YAML like yaml.safe_load, but refuse a key written twice in one mapping.

    PyYAML keeps the last of two equal keys without a word, so a second `refund_request:`
    further down the file would silently replace (and could ungate) the entry a reader sees.
    """
    loader = yaml.SafeLoader(content)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _refuse_duplicate_keys(root: yaml.Node) -> None:
    """Raise a YAML error naming a key written twice in one mapping, `<<` too (what it merges may be overridden)."""
    todo, seen_nodes = [root], set()
    while todo:
        node = todo.pop()
        if id(node) in seen_nodes:  # an alias is the anchored node itself: check it once
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
        if not isinstance(node, yaml.MappingNode):
            continue
        keys: set[tuple[str, str]] = set()
        for key, value in node.value:
            todo.extend((key, value))
            # A merge key itself counts: a second `<<` in one mapping would override the first's entries
            # (write `<<: [*a, *b]`); the keys it merges may still be overridden by the mapping's own.
            if not isinstance(key, yaml.ScalarNode):
                continue
            if (key.tag, key.value) in keys:
                raise yaml.constructor.ConstructorError(
                    problem=f"the key {key.value!r} is given twice in one mapping", problem_mark=key.start_mark
                )
            keys.add((key.tag, key.value))


def policy_version(data: bytes) -> str:
    """Return the version of a policy file: the first 12 hex digits of its bytes' sha256."""
    return hashlib.sha256(data).hexdigest()[:12]


def parse(raw: Any, path: Path, *, version: str = "") -> Policy:
    """Validate already-parsed YAML; every error names the file and the key."""
    config = _validate(ConfigFile, {} if raw is None else raw, path)
    agents = {name: _agent(name, entry, path) for name, entry in config.agents.items()}
    _check_tools_exist(agents, config.tool_overrides, path, prefix="agents.")
    _check_no_agent_rules(agents, path, prefix="agents.")
    return Policy(
        path=path,
        agents=agents,
        tool_overrides={**config.tool_overrides, **_mcp_tools(config.mcp, config.tool_overrides, path)},
        version=version,
        notifications=tuple(config.notifications),
    )


def mcp_tool_name(server: str, tool: str) -> str:
    """Return the policy tool name of an MCP server's tool."""
    return f"mcp.{server}.{tool}"


def _mcp_tools(
    servers: dict[str, dict[str, ToolPolicy]], overrides: dict[str, ToolPolicy], path: Path
) -> dict[str, ToolPolicy]:
    """Return the `mcp:` entries as tool_overrides; a policy tool named by two entries, or in both places, is refused."""
    tools: dict[str, ToolPolicy] = {}
    entries_of: dict[str, str] = {}
    for server, entries in servers.items():
        for tool, policy in entries.items():
            name, entry = mcp_tool_name(server, tool), f"server {server!r}, tool {tool!r}"
            if len(name) > MAX_NAME_CHARS:
                raise ConfigError(
                    f"{path}: mcp: the policy tool {name[:40]!r}… has {len(name)} characters: "
                    f"at most {MAX_NAME_CHARS} characters (mcp. and the server's and the tool's names)"
                )
            if name in tools:
                # A dot in a server's or a tool's name: kept silently, the later entry would replace the other's gate.
                raise ConfigError(
                    f"{path}: mcp.{server}.{tool}: two entries name the policy tool {name} "
                    f"({entries_of[name]}; {entry}); rename one of them"
                )
            tools[name], entries_of[name] = policy, entry
    for name in tools.keys() & overrides.keys():
        raise ConfigError(f"{path}: tool_overrides.{name}: configured under mcp: too; keep one of them")
    return tools


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
    "timeout": DURATION_PROBLEM,
    "remind_every": DURATION_PROBLEM,
    "escalate_to": "must be a list of group names or user:NAME",
    "system_prompt": "must be text",
    "description": "must be text",
    "base_url": "must be text",
    "model": "must be 'demo' or 'openai:<model name>'",
    "approvers": "must be a list of group names or user:NAME",
    "quorum": "must be a whole number from 1 to 20",
    "four_eyes": "must be true or false",
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
    """Refuse an agent's tool that no module registers.

    A name under the file's `tool_overrides` that no module registers is an external tool:
    its rules apply to the calls external agents gate (POST /api/gate), so it is not refused.
    An agent's own overrides only apply to the tools it runs, so there an unknown name is a typo.
    """
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


def configuration_problems(policy: Policy) -> list[str]:
    """Return what in the file looks like a mistake that weakens the gate, for the commands that start the site to say."""
    return [
        *_stricter_rules_the_deadline_undoes(policy),
        *_reminders_at_every_sweep(policy),
        *_typos_of_registered_tools(policy),
    ]


# A reminder goes to every approver of a waiting call; more often than this reads as a unit typed
# wrong (1s for 1h), and below the sweep's interval it goes out at every sweep.
REMINDER_WARNING_SECONDS = 60


def _reminders_at_every_sweep(policy: Policy) -> Iterator[str]:
    """Say each remind_every under a minute: every approver of each waiting call is reminded that often."""
    for name, tool in policy.tool_overrides.items():
        entries = [(f"tool_overrides.{name}", tool.remind_every)]
        entries += [(f"tool_overrides.{name}.rules.{rule.name}", rule.remind_every) for rule in tool.rules]
        for where, every in entries:
            if every is not None and every < REMINDER_WARNING_SECONDS:
                yield (
                    f"{policy.path}: {where}: remind_every is {every:g} s: every approver of each waiting call "
                    f"is reminded that often (at each of beat's sweeps, every {settings.AGENTFAST_SWEEP_SECONDS:g} s, "
                    "at the most); write minutes or hours (30m, 4h) unless that is meant"
                )


def _stricter_rules_the_deadline_undoes(policy: Policy) -> Iterator[str]:
    """Say each ask rule that asks more than its tool, yet takes the tool's `on_timeout: approve` or `escalate`.

    An ask rule takes the tool's deadline keys it does not set: one asking more people than the
    tool does still lets the clock approve its calls, or hands them at the deadline to the
    tool's escalate_to, who then decide calls the rule kept from them.
    """
    for name, tool in policy.tool_overrides.items():
        if tool.on_timeout not in ("approve", "escalate"):
            continue
        then = (
            "the clock approves its calls when nobody decides"
            if tool.on_timeout == "approve"
            else f"its calls go at the deadline to the tool's escalate_to ({', '.join(tool.escalate_to or ())})"
        )
        for rule in tool.rules:
            more = _asks_more(rule, tool) if rule.action == "ask" and rule.on_timeout is None else ""
            if more:
                yield (
                    f"{policy.path}: tool_overrides.{name}.rules.{rule.name}: asks for {more}, yet takes the "
                    f"tool's on_timeout: {tool.on_timeout}, so {then}; give the rule its own on_timeout "
                    "unless that is meant"
                )


def _typos_of_registered_tools(policy: Policy) -> Iterator[str]:
    """Say each tool_overrides name one typo away from a registered tool the file does not list.

    A name that no module registers is an external agent's tool, so such a typo is no error, yet
    it leaves the registered tool unlisted: it runs without asking anyone.
    """
    from agents.tools.registry import registry

    registered = [name for name in registry.names() if name not in policy.tool_overrides]
    for name in policy.tool_overrides:
        if name in registry:
            continue
        for near in difflib.get_close_matches(name, registered, n=1, cutoff=0.85):
            yield (
                f"{policy.path}: tool_overrides.{name}: no registered tool has this name, so it is taken for "
                f"an external agent's tool; the registered {near!r} is not listed and runs without asking anyone"
            )


def _asks_more(rule: Rule, tool: ToolPolicy) -> str:
    """Return what an ask rule asks beyond its tool ("" when nothing): more approvals, or other approvers."""
    if rule.quorum is not None and rule.quorum > tool.quorum:
        return f"{rule.quorum} approvals where the tool asks {tool.quorum}"
    if rule.approvers is not None and set(rule.approvers) != set(tool.approvers):
        return f"other approvers ({', '.join(rule.approvers) or 'any reviewer'}) than the tool's"
    return ""


def _check_no_agent_rules(agents: dict[str, AgentSpec], path: Path, *, prefix: str) -> None:
    # Rules can allow, so an agent carrying its own could weaken the file's floor: only the file's tools have rules.
    for agent in agents.values():
        where = f"{prefix}{agent.name}." if prefix else ""
        for tool_name, own in agent.tool_overrides.items():
            if own.rules:
                raise ConfigError(
                    f"{path}: {where}tool_overrides.{tool_name}.rules: an agent's own tool_overrides may not carry "
                    f"rules (they could allow what the file gates); write them under the top-level tool_overrides"
                )


# -- CEL --------------------------------------------------------------------------
# `common-expression-language` (Rust bindings) rather than `cel-python`: measured on the
# demo rule, about 35 µs per evaluation against about 390 µs, and it reports the position
# of a syntax error; both are maintained. Compiled programs are cached per expression.

CEL_VARIABLES = frozenset({"args", "tool", "agent", "account", "run", "now"})
_programs: dict[str, Any] = {}
_CEL_POSITION = re.compile(r"<input>:(\d+):(\d+): (.*)")
# CEL's macros walk a list or map, binding a loop variable: `args.to.all(r, r.endsWith('@corp.com'))`.
_CEL_MACRO = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")


@cache  # as compile_cel: the file's few expressions, asked again at every call a rule evaluates
def cel_loop_variables(expression: str) -> frozenset[str]:
    """Return the loop variables the expression's macros bind (none: it walks no list)."""
    return frozenset(_CEL_MACRO.findall(expression))


_CEL_MACRO_CALL = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(")
# String literals (raw ones take no escapes) and comments: their brackets are no code's.
_CEL_NOT_CODE = re.compile(
    r"""(?<![A-Za-z0-9_])(?:[rR][bB]?|[bB][rR])('''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'[^'\n]*'|"[^"\n]*")"""
    r"""|(?<![A-Za-z0-9_])[bB]?('''(?:\\[\s\S]|[^\\])*?'''|\"\"\"(?:\\[\s\S]|[^\\])*?\"\"\")"""
    r"""|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"|//[^\n]*"""
)


@cache
def cel_macro_depth(expression: str) -> int:
    """Return how deeply the expression's macros nest: 0 without one, 2 for a macro inside another's body.

    Nested, the inner macro walks its list once per item of the outer one. When the brackets
    cannot be read (unbalanced once strings are set aside) every macro counts as nested.
    """
    calls = len(_CEL_MACRO_CALL.findall(expression))
    if calls <= 1:
        return calls
    code = _CEL_NOT_CODE.sub(lambda found: " " * len(found.group()), expression)
    starts = {found.end() - 1 for found in _CEL_MACRO_CALL.finditer(code)}
    if len(starts) != calls:  # a macro's name in a string, or a string read wrong: count every one
        return calls
    opened: list[bool] = []  # for each open bracket, whether it is a macro's
    deepest = 0
    for position, char in enumerate(code):
        if char == "(":
            opened.append(position in starts)
            deepest = max(deepest, sum(opened))
        elif char == ")":
            if not opened:
                return calls
            opened.pop()
    return calls if opened else deepest


def compile_cel(expression: str) -> Any:
    """Return the compiled program of a CEL expression (cached); raise ValueError if it is wrong."""
    program = _programs.get(expression)
    if program is None:
        program = _cel().compile(expression)
        _programs[expression] = program
    return program


def _cel() -> ModuleType:
    """Import the CEL package without its interactive command-line tool.

    The package's __init__ imports `cel.cli` (prompt_toolkit and rich), 0.16 s of the start of
    every process that loads a policy with a rule: each `agentfast` command, worker and web
    process. The compiler is the compiled extension; the tool is never used here, so an empty
    module stands in for it (unless something imported the package first).
    """
    if "cel" not in sys.modules:
        sys.modules.setdefault("cel.cli", ModuleType("cel.cli"))
    import cel

    return cel


def cel_problem(expression: str) -> str:
    """Return what is wrong with a CEL condition, with its position, or "" if it compiles."""
    try:
        program = compile_cel(expression)
    except (ValueError, RuntimeError, TypeError) as exc:
        message = str(exc)
        found = _CEL_POSITION.search(message)
        if found:
            line, column, problem = found.groups()
            return f"{problem.strip()} (position {line}:{column})"
        return " ".join(message.split())
    unknown = sorted(set(program.variables()) - CEL_VARIABLES - cel_loop_variables(expression))
    if unknown:
        known = ", ".join(sorted(CEL_VARIABLES))
        return f"unknown variable {unknown[0]!r} (known: {known}) (position 1:{expression.find(unknown[0]) + 1})"
    return ""
