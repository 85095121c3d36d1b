"""What the policy says about one proposed call, in DESIGN.md's order; a pure function, no database.

1. deny rules → the call is refused, nobody is asked;
2. a remembered decision (a standing grant), looked up through `grant_lookup`;
3. allow rules → the call runs at once;
4. schedule rules → the call waits until the time its `at` expression gives, then runs;
5. ask rules, or the tool's own settings → a person decides (or, for a low-risk tool, it runs).

A rule whose condition cannot be evaluated (a missing argument, a type error, a result
that is not a boolean) fails closed: it counts as matching when it denies or asks, as not
matching when it allows; a schedule rule then asks a person instead of scheduling (a
scheduled call runs by itself). The verdict's reason says which rule could not be evaluated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from agents.policy.config import AgentSpec, Policy, Rule, ToolPolicy, cel_macro_depth

Action = Literal["allow", "deny", "ask", "schedule"]
# The most items of one list or map in the arguments a rule with a macro (all, exists,
# exists_one, map, filter) evaluates over; more, and it cannot be evaluated (fails closed).
MACRO_ITEMS = 1_000


@dataclass(frozen=True)
class CallFacts:
    """What a rule's condition may read: the CEL variables args, tool, agent, account, run and now."""

    tool: str
    args: dict[str, Any]
    agent: str
    run: dict[str, Any] = field(default_factory=dict)  # id, agent, created_by, input
    now: datetime | None = None
    # The authenticated account of an external call ("" for a run agentfast drives): an
    # external caller names its `agent` itself, so this is what a rule or grant can trust.
    account: str = ""

    def variables(self) -> dict[str, Any]:
        """Return the CEL context."""
        run = {"id": "", "agent": self.agent, "created_by": "", "input": "", **self.run}
        return {
            "args": self.args,
            "tool": self.tool,
            "agent": self.agent,
            "account": self.account,
            "run": run,
            "now": self.now or datetime.now(UTC),
        }


@dataclass(frozen=True)
class GrantMatch:
    """A remembered decision that applies to a call (filled by the standing-grants engine)."""

    id: str
    action: Literal["allow", "deny"]
    reason: str = ""


GrantLookup = Callable[[CallFacts, ToolPolicy], GrantMatch | None]


def no_grant(facts: CallFacts, policy: ToolPolicy) -> GrantMatch | None:
    """Return no grant: what evaluate() finds when its caller passes no lookup (policy check, tests)."""
    return None


@dataclass(frozen=True)
class Verdict:
    """The outcome for one call: what happens, which rule (or grant) decided, and who may decide."""

    action: Action
    rule: str = ""  # the deciding rule's name; "" for the tool's own settings (or a grant)
    reason: str = ""
    approvers: tuple[str, ...] = ()
    quorum: int = 1
    four_eyes: bool = False
    mode: str = "suspend"
    timeout_seconds: float | None = None
    on_timeout: str = "reject"  # what the deadline does: reject, approve or escalate
    escalate_to: tuple[str, ...] = ()
    remind_every_seconds: float | None = None
    run_at: datetime | None = None  # a schedule rule's time
    grants: bool = True
    policy_version: str = ""
    grant_id: str = ""
    listed: bool = False  # the tool has a policy entry (an unlisted tool just runs, with no row)

    @property
    def decided_by(self) -> str:
        """Return who decided automatically: "policy:<rule>", "grant:<id>", or "" when a person (or nobody) must."""
        if self.grant_id:
            return f"grant:{self.grant_id}"
        if self.rule and self.action not in ("ask", "schedule"):
            return f"policy:{self.rule}"
        return ""

    def held_until(self, now: datetime) -> datetime | None:
        """Return when a schedule rule's call runs, while that is later than `now`; None: it runs now (or is no schedule)."""
        if self.action != "schedule" or self.run_at is None or self.run_at <= now:
            return None
        return self.run_at

    @property
    def automatic(self) -> bool:
        """Return whether a rule or grant decided: the call gets an approval row decided by the policy."""
        return bool(self.decided_by)

    def as_dict(self) -> dict[str, Any]:
        """Return the verdict as JSON-ready data (the CLI's --json, the policy page)."""
        return {
            "action": self.action,
            "rule": self.rule or None,
            "decided_by": self.decided_by or None,
            "reason": self.reason,
            "approvers": list(self.approvers),
            "quorum": self.quorum,
            "four_eyes": self.four_eyes,
            "mode": self.mode,
            "timeout_seconds": self.timeout_seconds,
            "on_timeout": self.on_timeout,
            "escalate_to": list(self.escalate_to),
            "remind_every_seconds": self.remind_every_seconds,
            "run_at": self.run_at.isoformat() if self.run_at else None,
            "grants": self.grants,
            "policy_version": self.policy_version,
        }


def evaluate(
    policy: Policy,
    facts: CallFacts,
    *,
    agent: AgentSpec | None = None,
    grant_lookup: GrantLookup | None = None,
) -> Verdict:
    """Return what the policy says about a proposed call (deny → grant → allow → ask)."""
    tool = policy.tool_policy(facts.tool, agent=agent)
    listed = facts.tool in policy.tool_overrides or (agent is not None and facts.tool in agent.tool_overrides)
    base = Verdict(
        action="ask" if tool.gated else "allow",
        approvers=tuple(tool.approvers),
        quorum=tool.quorum,
        four_eyes=tool.four_eyes,
        mode=tool.hitl_mode,
        **tool_deadline(tool),
        grants=tool.grants,
        policy_version=policy.version,
        listed=listed,
    )
    if not tool.rules and not tool.gated:
        return base  # the common unlisted tool: nothing to evaluate
    variables = facts.variables()
    widest = _macro_widest(tool.rules, facts.args)
    results = {rule.name: _holds(rule, variables, widest) for rule in tool.rules}
    failures = [
        f"rule {name!r} could not be evaluated ({problem})" for name, (_, problem) in results.items() if problem
    ]

    def matches(rule: Rule) -> bool:
        held, problem = results[rule.name]
        return rule.action != "allow" if problem else held

    def said(reason: str) -> str:
        return "; ".join([reason, *failures]) if reason else "; ".join(failures)

    for rule in (r for r in tool.rules if r.action == "deny" and matches(r)):
        return replace(base, action="deny", rule=rule.name, reason=said(rule.reason or f"denied by rule {rule.name}"))
    # Whom the policy asks for this call: the first matching ask rule's approvers and quorum (as
    # asked() says, from the conditions evaluated above), else the tool's.
    # An ask rule's quorum is never under an agent's raised one: config.floor raised it.
    ask_rule = next((r for r in tool.rules if r.action == "ask" and matches(r)), None)
    approvers, quorum = _askers(ask_rule, base.approvers, base.quorum) if ask_rule else (base.approvers, base.quorum)
    grant = (grant_lookup or no_grant)(facts, tool) if tool.grants else None
    if grant is not None:
        reason = said(grant.reason or f"{'approved' if grant.action == 'allow' else 'rejected'} by grant {grant.id}")
        # The grant stands in for those asked (grant_match judged its creator by them): the decision
        # recorded, and grant_use, check the same.
        return replace(base, action=grant.action, grant_id=grant.id, reason=reason, approvers=approvers, quorum=quorum)
    for rule in (r for r in tool.rules if r.action == "allow" and matches(r)):
        return replace(base, action="allow", rule=rule.name, reason=said(f"allowed by rule {rule.name}"))
    for rule in (r for r in tool.rules if r.action == "schedule" and matches(r)):
        # A scheduled call runs by itself: a condition that cannot be evaluated asks a person, as a time that cannot.
        run_at, problem = (None, "") if results[rule.name][1] else _when(rule, variables, widest)
        if run_at is not None:
            return replace(
                base, action="schedule", rule=rule.name, reason=said(f"rule {rule.name} schedules"), run_at=run_at
            )
        if problem:
            failures.append(f"rule {rule.name!r} gave no time ({problem}): a person decides instead")
        # A person decides, as the ask rules (or the tool) say: never fewer than without this rule.
        unscheduled = rule
        break
    else:
        unscheduled = None
    if ask_rule is not None:
        return replace(
            base,
            action="ask",
            rule=ask_rule.name,
            reason=said(f"rule {ask_rule.name} asks"),
            approvers=approvers,
            quorum=quorum,
            **rule_deadline(ask_rule, base),
        )
    if unscheduled is not None:
        return replace(base, action="ask", rule=unscheduled.name, reason=said(""))
    return replace(base, reason=said(""))


def denied(policy: Policy, facts: CallFacts, *, agent: AgentSpec | None = None) -> Verdict | None:
    """Return the verdict of the first deny rule the call matches, as evaluate() gives it, or None.

    Only the tool's deny rules are evaluated, and no grant is looked up: what an approval of a
    call that already waits asks of the policy as it stands (services.approvals.denial_now), on
    the decision's path. A deny rule that cannot be evaluated matches, as in evaluate().
    """
    tool = policy.tool_policy(facts.tool, agent=agent)
    denying = [rule for rule in tool.rules if rule.action == "deny"]
    if not denying:
        return None
    variables = facts.variables()
    widest = _macro_widest(denying, facts.args)
    for rule in denying:
        held, problem = _holds(rule, variables, widest)
        if held or problem:
            reason = rule.reason or f"denied by rule {rule.name}"
            if problem:
                reason += f"; rule {rule.name!r} could not be evaluated ({problem})"
            return Verdict(action="deny", rule=rule.name, reason=reason, policy_version=policy.version)
    return None


def asked(facts: CallFacts, tool: ToolPolicy) -> tuple[tuple[str, ...], int]:
    """Return who an ask for this call goes to, and how many: the first matching ask rule's, else the tool's."""
    variables = facts.variables()
    widest = _macro_widest(tool.rules, facts.args)
    for rule in (r for r in tool.rules if r.action == "ask"):
        held, problem = _holds(rule, variables, widest)
        if held or problem:  # a rule that cannot be evaluated asks: fail closed
            return _askers(rule, tuple(tool.approvers), tool.quorum)
    return tuple(tool.approvers), tool.quorum


def _askers(rule: Rule, approvers: tuple[str, ...], quorum: int) -> tuple[tuple[str, ...], int]:
    """Return an ask rule's approvers and quorum, each falling back to the tool's."""
    return (tuple(rule.approvers) if rule.approvers is not None else approvers), rule.quorum or quorum


def tool_deadline(tool: ToolPolicy) -> dict[str, Any]:
    """Return a tool's deadline keys as a verdict carries them (no on_timeout: reject)."""
    return {
        "timeout_seconds": tool.deadline_seconds,
        "on_timeout": tool.on_timeout or "reject",
        "escalate_to": tuple(tool.escalate_to or ()),
        "remind_every_seconds": tool.remind_every,
    }


def rule_deadline(rule: Rule, base: Verdict) -> dict[str, Any]:
    """Return an ask rule's deadline keys, each falling back to the tool's."""
    return {
        "timeout_seconds": rule.timeout if rule.timeout is not None else base.timeout_seconds,
        "on_timeout": rule.on_timeout or base.on_timeout,
        "escalate_to": rule.escalate_to if rule.escalate_to is not None else base.escalate_to,
        "remind_every_seconds": rule.remind_every if rule.remind_every is not None else base.remind_every_seconds,
    }


def _when(rule: Rule, variables: dict[str, Any], widest: int) -> tuple[datetime | None, str]:
    """Evaluate a schedule rule's `at`: (an aware timestamp, "") or (None, the problem)."""
    too_wide = _too_wide(rule.at or "", widest)
    if too_wide:
        return None, too_wide
    try:
        result = rule.at_program.execute(variables)
    except Exception as exc:  # noqa: BLE001 — as _holds: a broken expression fails closed
        return None, " ".join(str(exc).split())[:200] or type(exc).__name__
    if not isinstance(result, datetime):
        return None, f"`at` gave {type(result).__name__}, not a timestamp"
    return (result if result.tzinfo else result.replace(tzinfo=UTC)), ""


def _holds(rule: Rule, variables: dict[str, Any], widest: int) -> tuple[bool, str]:
    """Evaluate a rule's condition: (held, "") or (False, the problem) when it cannot be evaluated."""
    too_wide = _too_wide(rule.when, widest)
    if too_wide:
        return False, too_wide
    try:
        result = rule.program.execute(variables)
    except Exception as exc:  # noqa: BLE001 — whatever the library raises, the rule fails closed
        return False, " ".join(str(exc).split())[:200] or type(exc).__name__
    if not isinstance(result, bool):
        return False, f"its condition gave {type(result).__name__}, not true or false"
    return result, ""


def _macro_widest(rules: Sequence[Rule], args: dict[str, Any]) -> int:
    """Return the most items of a list or map in the arguments (0 when no rule has a macro to walk them)."""
    if not any(cel_macro_depth(f"{rule.when} {rule.at or ''}") for rule in rules):
        return 0
    return _widest(args)


def macro_items(depth: int) -> int:
    """Return the most items the macros of an expression nested `depth` deep may walk.

    CEL has no cost limit, its evaluation holds the GIL, and `map` and `filter` take time
    quadratic in the list: 10,000 items took seconds, with the whole process stopped. Nested,
    the inner macro runs once per item of the outer: the bound keeps items ** (depth + 1)
    within MACRO_ITEMS ** 2 (1,000 items for one macro, 100 for two nested, 32 for three).
    """
    return MACRO_ITEMS if depth <= 1 else round(MACRO_ITEMS ** (2 / (depth + 1)))


def _too_wide(expression: str, widest: int) -> str:
    """Return why the expression's macros may not walk arguments this wide ("" when they may, or it has none)."""
    depth = cel_macro_depth(expression)
    if not depth or widest <= macro_items(depth):
        return ""
    if depth == 1:
        return f"a list or map of {widest} items is more than a rule's macros walk ({MACRO_ITEMS})"
    limit = macro_items(depth)
    return f"a list or map of {widest} items is more than a rule's macros nested {depth} deep walk ({limit})"


def _widest(value: Any) -> int:
    """Return the most items of any list or map in the value, however deep (arguments are at most 32 deep)."""
    widest, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            widest = max(widest, len(item))
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            widest = max(widest, len(item))
            stack.extend(item)
    return widest


class CheckError(Exception):
    """A policy check cannot be answered (unknown agent or tool, arguments the tool refuses)."""


def check(tool_name: str, arguments: dict[str, Any], *, agent_name: str, by: str = "", account: str = "") -> Verdict:
    """Return what would happen if the agent proposed this call now, without running or recording anything.

    With `account`, the call is an external agent's, gated by that agent account: the rules
    apply as the gate applies them (`account` set), to a tool no module need register, for
    an agent agentfast.yaml need not list.
    """
    from agents.policy.config import ConfigError, get_policy
    from agents.tools import InvalidArguments, ToolError, registry

    policy = get_policy()
    if account:
        run = {"id": "", "agent": agent_name, "created_by": account, "input": ""}
        return evaluate(policy, CallFacts(tool=tool_name, args=arguments, agent=agent_name, run=run, account=account))
    try:
        agent = policy.agent(agent_name)
    except ConfigError as exc:
        raise CheckError(str(exc)) from None
    if tool_name not in agent.tools:
        raise CheckError(
            f"agent {agent_name!r} has no tool {tool_name!r} (its tools: {', '.join(agent.tools) or 'none'})"
        )
    tool = registry.tools[tool_name]
    try:
        tool.check_arguments(tool.validate(arguments))
    except InvalidArguments as exc:
        raise CheckError(f"the tool would refuse these arguments: {exc.message}") from None
    except ToolError as exc:
        raise CheckError(f"the tool would refuse these arguments: {exc.message}") from None
    run = {"id": "", "agent": agent_name, "created_by": by, "input": ""}
    return evaluate(policy, CallFacts(tool=tool_name, args=arguments, agent=agent_name, run=run), agent=agent)


def describe(verdict: Verdict) -> str:
    """Return the outcome in plain words."""
    if verdict.action == "deny":
        return f"denied by {verdict.decided_by}: {verdict.reason}"
    if verdict.action == "allow":
        return f"runs at once, allowed by {verdict.decided_by}" if verdict.automatic else "runs at once (low risk)"
    if verdict.action == "schedule":
        return f"waits until {verdict.run_at:%Y-%m-%d %H:%M:%S %Z} (rule {verdict.rule!r}), then runs"
    who = ", ".join(verdict.approvers) if verdict.approvers else "any reviewer"
    source = f"rule {verdict.rule!r}" if verdict.rule else "the tool's own settings"
    return f"asks ({verdict.mode}) by {source}: {verdict.quorum} approval(s) from {who}"
