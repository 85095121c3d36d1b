"""The read-only policy pages: what agentfast.yaml says about each tool, and a box to try a call."""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents import text
from agents.policy import ConfigError, ToolPolicy, get_policy
from agents.policy.config import Rule
from agents.policy.rules import CheckError, Verdict, check, describe, rule_deadline, tool_deadline
from agents.tools import registry
from dashboard.auth import reviewer_required

MAX_ARGUMENTS_CHARS = 10_000
ACCOUNT_CHARS = cast(int, User._meta.get_field("username").max_length)  # an agent account is a user


@require_GET
@reviewer_required
def policy_list(request: HttpRequest) -> HttpResponse:
    """List every tool an agent uses, with what its calls need."""
    try:
        policy = get_policy()
    except ConfigError as exc:
        return _unreadable(request, exc)
    names = sorted({name for agent in policy.agents.values() for name in agent.tools} | set(policy.tool_overrides))
    tools = [_tool_summary(name, policy.tool_policy(name), name in policy.tool_overrides) for name in names]
    return render(request, "dashboard/policy.html", {"tools": tools, "version": policy.version, "path": policy.path})


@require_GET
@reviewer_required
def policy_tool(request: HttpRequest, tool: str) -> HttpResponse:
    """Show one tool's settings and rules in plain words; with ?args=…&agent=…, the verdict for that call.

    An external tool (listed in the file, registered by no module: external agents' calls to it go
    through the gate) is checked as the gate would judge an agent account's call (&account=…).
    """
    try:
        policy = get_policy()
    except ConfigError as exc:
        return _unreadable(request, exc)
    external = tool not in registry.tools
    if external and tool not in policy.tool_overrides:
        raise Http404("No such tool.")
    agents = sorted(name for name, agent in policy.agents.items() if tool in agent.tools)
    context: dict[str, Any] = {
        "tool": _tool_summary(tool, policy.tool_policy(tool), tool in policy.tool_overrides),
        "external": external,
        "version": policy.version,
        "agents": agents,
        "agent": request.GET.get("agent") or (agents[0] if agents else ""),
        "arguments": request.GET.get("args", ""),
        "account": request.GET.get("account", ""),
    }
    status = 200
    if "args" in request.GET:
        try:
            account = _account(context["account"]) if external else ""
            context["verdict"] = _check(tool, context["arguments"], context["agent"], account)
            context["means"] = describe(context["verdict"])
        except (CheckError, ConfigError, text.UnsafeText) as exc:
            context["error"] = getattr(exc, "message", None) or str(exc)
            status = 400
    return render(request, "dashboard/policy_tool.html", context, status=status)


def _unreadable(request: HttpRequest, exc: ConfigError) -> HttpResponse:
    """Say why there is no policy to show: the file cannot be read (a half-saved edit)."""
    context = {"tools": [], "version": "", "path": "", "config_error": str(exc)}
    return render(request, "dashboard/policy.html", context)


def _check(tool: str, raw: str, agent: str, account: str) -> Any:
    if len(raw) > MAX_ARGUMENTS_CHARS:
        raise CheckError(f"arguments: longer than {MAX_ARGUMENTS_CHARS} characters")
    arguments = text.loads_strict(raw or "{}", field="arguments")
    if not isinstance(arguments, dict):
        raise CheckError('arguments: must be a JSON object, like {"amount_cents": 1000}')
    return check(tool, arguments, agent_name=text.require_clean(agent, field="agent"), account=account)


def _account(account: str) -> str:
    """Return the agent account an external call is checked for; one is needed, as the gate always has one."""
    account = text.require_clean(account, field="account").strip()
    if not account:
        raise CheckError("account: name the agent account whose call to check (rules may read `account`)")
    if len(account) > ACCOUNT_CHARS:
        raise CheckError(f"account: an account's name has at most {ACCOUNT_CHARS} characters")
    return account


def _tool_summary(name: str, tool: ToolPolicy, listed: bool) -> dict[str, Any]:
    """Return a tool's policy in plain words for the templates."""
    approvers = list(getattr(tool, "approvers", None) or ())
    asks = Verdict(action="ask", **tool_deadline(tool))  # what an ask rule falls back to
    return {
        "name": name,
        "listed": listed,
        "gated": tool.gated,
        "mode": tool.hitl_mode,
        "deadline": _deadline(asks.timeout_seconds, asks.on_timeout, asks.escalate_to),
        "approvers": approvers,
        "quorum": getattr(tool, "quorum", None) or 1,
        "four_eyes": bool(getattr(tool, "four_eyes", False)),
        "grants": tool.grants,
        "rules": [
            {
                "name": rule.name,
                "when": rule.when,
                "action": rule.action,
                "reason": rule.reason,
                # None: the tool's approvers; an empty list: any reviewer (the rule overrides the tool's).
                "approvers": list(rule.approvers) if rule.approvers is not None else None,
                "quorum": rule.quorum or tool.quorum,
                "at": rule.at,
                "deadline": _rule_deadline(rule, asks) if rule.action == "ask" else "",
            }
            # Shown in the order they are evaluated (agents.policy.rules.evaluate).
            for rule in sorted(tool.rules, key=lambda rule: _EVALUATION_ORDER.index(rule.action))
        ],
    }


_EVALUATION_ORDER = ("deny", "allow", "schedule", "ask")


def _rule_deadline(rule: Rule, tools: Verdict) -> str:
    """Say an ask rule's deadline as the policy applies it: each key it does not set is its tool's."""
    keys = rule_deadline(rule, tools)
    return _deadline(keys["timeout_seconds"], keys["on_timeout"], keys["escalate_to"])


def _deadline(seconds: float | None, on_timeout: str, escalate_to: tuple[str, ...]) -> str:
    """Say a deadline in plain words: "within 4h, then approved by the clock" ("" for none)."""
    if not seconds:
        return ""
    then = {"approve": "approved by the clock", "escalate": f"escalated to {', '.join(escalate_to)}"}
    return f"within {_duration(seconds)}, then {then.get(on_timeout, 'rejected')}"


def _duration(seconds: float) -> str:
    """Say seconds as agentfast.yaml writes a duration: 2d, 4h, 30m or 90s."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
