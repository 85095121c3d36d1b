"""The developers' playground: try a prompt on an agent and watch its run stream.

The page drives its runs itself, through the JSON API: it creates a run here (queued,
auto_resume off, so no worker races it), then POSTs /api/runs/{id}/resume with
`Accept: text/event-stream` to drive and stream it; after an inline approval it resumes
and streams again from the last seq it rendered. Runs started here carry the user's
name as created_by and started_from "playground", which is how the page finds your recent ones.

An agent composed on the page (system prompt, tools and their risk, model) travels with its
run (Run.agent_config), so any worker can drive it; it is named after a hash of its
settings, so runs of the same settings carry the same name; people read it as its saved
name or "composed: <tools> · <model>" (agent_label). A composed agent may be saved under a
name (SavedAgent, its owner's own) and picked again. agentfast.yaml's policy is a
floor: a composed agent may add gates, never remove or weaken them. The page shows the
floor, and the engine applies it to every run whatever was posted (the server decides).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from typing import Any, cast

from django import forms
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from agents import schemas, selectors, services, text
from agents.models import Run, SavedAgent
from agents.policy import (
    MODES,
    RISKS,
    UNLISTED,
    AgentSpec,
    ConfigError,
    ToolPolicy,
    agent_for,
    get_policy,
)
from agents.services.approvals import MAX_TEXT_CHARS
from agents.services.runs import MAX_INPUT_CHARS
from agents.services.saved_agents import MAX_NAME_CHARS
from agents.tools import registry
from dashboard.auth import reviewer_required

HISTORY_SIZE = 12
COMPOSE = "__compose__"  # the agent choice that means "the one described below"
SAVED = "saved:"  # the agent choice of a saved agent: "saved:<id>"
COMPOSED = "playground-"  # the name prefix of composed agents
UNNAMED = "Composed in the playground."  # a composed agent's description, unless it was saved under a name
# What the built-in demo model understands (agents.llm.demo), one click away.
DEMO_PROMPTS = (
    "Refund order A1001 for 25.00 USD",
    "Refund orders A1001 and A1002 for 10.00 USD each",
    "Email bob@example.com that his refund is on its way",
    "Ask a human whether to expedite order A1003",
)


PLAYGROUND = "playground"  # the started_from of runs started here


def _owner(request: HttpRequest) -> User:
    """Return the signed-in user (every view here requires one)."""
    return cast(User, request.user)


def creator(request: HttpRequest) -> str:
    """Return the created_by of the runs a user starts in the playground: their username (four eyes compare it)."""
    return request.user.get_username()


def recent_runs(request: HttpRequest) -> QuerySet[Run]:
    return selectors.run_list(created_by=creator(request)).filter(started_from=PLAYGROUND)[:HISTORY_SIZE]


class RunForm(forms.Form):
    agent = forms.ChoiceField()
    input = forms.CharField(max_length=MAX_INPUT_CHARS, strip=False)

    def __init__(
        self, *args: Any, agents: list[AgentSpec], saved_agents: Iterable[SavedAgent] = (), **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        choices = [(agent.name, agent.name) for agent in agents] + [(COMPOSE, "compose")]
        choices += [(f"{SAVED}{saved.pk}", saved.name) for saved in saved_agents]
        cast(forms.ChoiceField, self.fields["agent"]).choices = choices


class AgentForm(forms.Form):
    """An agent composed on the page: its prompt, model, tools and each tool's risk and mode."""

    system_prompt = forms.CharField(required=False, max_length=MAX_TEXT_CHARS, strip=False)
    model = forms.ChoiceField(choices=[("demo", "demo"), ("openai", "openai")])
    model_name = forms.RegexField(required=False, max_length=100, regex=r"^[\w.:/-]+$")
    tools = forms.MultipleChoiceField(required=False)
    agent_name = forms.CharField(required=False, max_length=MAX_NAME_CHARS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["tools"]).choices = [(name, name) for name in registry.names()]
        for name in registry.names():
            self.fields[f"risk_{name}"] = forms.ChoiceField(choices=[(r, r) for r in RISKS], required=False)
            self.fields[f"mode_{name}"] = forms.ChoiceField(choices=[(m, m) for m in MODES], required=False)

    def clean_tools(self) -> list[str]:
        """Return the tools chosen, each once: the same settings make the same agent."""
        return list(dict.fromkeys(self.cleaned_data["tools"]))

    def clean_agent_name(self) -> str:
        """Return the name as it is saved, refusing a configured agent's: runs list it as their agent."""
        name = " ".join(self.cleaned_data["agent_name"].split())
        if name.casefold() in {agent.name.casefold() for agent in _agents()[0]}:
            raise forms.ValidationError(f"{name!r} is a configured agent's name; give yours another")
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("model") == "openai" and not data.get("model_name"):
            self.add_error("model_name", "name the model the OpenAI-compatible endpoint serves")
        return data

    def spec(self) -> dict[str, Any]:
        """Return the agent as agentfast.yaml would write it; a tool's keys left out keep the policy's defaults."""
        data = self.cleaned_data
        tools = data["tools"]
        overrides = {name: self._rule(name) for name in tools}
        return {
            "description": data.get("agent_name") or UNNAMED,
            "model": f"openai:{data['model_name']}" if data["model"] == "openai" else "demo",
            "system_prompt": data["system_prompt"],
            "tools": tools,
            "tool_overrides": {name: rule for name, rule in overrides.items() if rule},
        }

    def _rule(self, tool_name: str) -> dict[str, str]:
        rule = {"risk": self.cleaned_data[f"risk_{tool_name}"], "hitl_mode": self.cleaned_data[f"mode_{tool_name}"]}
        return {key: value for key, value in rule.items() if value}


@require_GET
@reviewer_required
def page(request: HttpRequest) -> HttpResponse:
    agents, config_error = _agents()
    run_id = request.GET.get("run", "")
    context = {
        "agents": agents,
        "compose": COMPOSE,
        "saved_agents": [_saved_option(saved) for saved in selectors.saved_agents(owner_id=_owner(request).pk)],
        "tools": _tools(),
        "openai_endpoint": os.environ.get("OPENAI_BASE_URL", ""),
        "risks": RISKS,
        "modes": MODES,
        "config_error": config_error,
        "history": recent_runs(request),
        # No run's id holds NUL or a lone surrogate (and PostgreSQL refuses to compare with one).
        "run_id": run_id if run_id and text.problem(run_id) is None and selectors.run_exists(run_id) else "",
        "prompts": DEMO_PROMPTS,
    }
    return render(request, "dashboard/playground.html", context)


def _saved_option(saved: SavedAgent) -> dict[str, Any]:
    """Return a saved agent as the page's agent picker shows it."""
    spec = saved.definition
    return {
        "value": f"{SAVED}{saved.pk}",
        "name": saved.name,
        "model": spec.get("model", ""),
        "tools": ", ".join(spec.get("tools", [])),
        "definition": text.dumps(spec),
    }


@require_POST
@reviewer_required
def run_create(request: HttpRequest) -> JsonResponse:
    """Create a playground run (queued, auto_resume off); the page then drives and streams it."""
    agents, _ = _agents()
    form = RunForm(request.POST, agents=agents, saved_agents=selectors.saved_agents(owner_id=_owner(request).pk))
    if not form.is_valid():
        return _invalid(form)
    agent, agent_config = form.cleaned_data["agent"], None
    if agent == COMPOSE:
        composed = AgentForm(request.POST)
        if not composed.is_valid():
            return _invalid(composed)
        agent_config = composed.spec()
    elif agent.startswith(SAVED):
        saved = selectors.saved_agent_get(owner_id=_owner(request).pk, saved_id=int(agent[len(SAVED) :]))
        agent_config = saved.definition
    if agent_config is not None:
        agent = composed_name(agent_config)
    try:
        run = services.run_create(
            agent=agent,
            agent_config=agent_config,
            input=form.cleaned_data["input"],
            created_by=creator(request),
            started_from=PLAYGROUND,
            auto_resume=False,
            enqueue=False,
        )
    except services.InvalidInput as exc:
        return JsonResponse({"error_code": exc.code, "message": exc.message, **exc.details}, status=400)
    label = agent_label(run.agent, run.agent_config)
    return JsonResponse({"run": schemas.RunSummary.of(run).as_json(), "agent_label": label}, status=201)


@require_POST
@reviewer_required
def agent_save(request: HttpRequest) -> JsonResponse:
    """Save the agent composed on the page under the name given; the page adds it to its picker."""
    composed = AgentForm(request.POST)
    if not composed.is_valid():
        return _invalid(composed)
    try:
        saved = services.savedagent_save(
            owner=_owner(request), name=composed.cleaned_data["agent_name"], definition=composed.spec()
        )
    except services.InvalidInput as exc:
        return JsonResponse({"error_code": exc.code, "message": exc.message, **exc.details}, status=400)
    return JsonResponse({"agent": _saved_option(saved)}, status=201)


def composed_name(spec: dict[str, Any]) -> str:
    """Name a composed agent after its settings, so runs of the same settings group together."""
    return COMPOSED + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def agent_label(agent: str, agent_config: dict[str, Any] | None) -> str:
    """Return the name people read for a run's agent: its saved name, or "composed: <tools> · <model>"."""
    if not agent.startswith(COMPOSED) or not isinstance(agent_config, dict):
        return agent
    description = str(agent_config.get("description") or "")
    if description and description != UNNAMED:
        return description
    tools = [str(tool) for tool in agent_config.get("tools") or []]
    shown = ", ".join(tools[:2]) + (f" +{len(tools) - 2}" if len(tools) > 2 else "") if tools else "no tools"
    return f"composed: {shown} · {agent_config.get('model', 'demo')}"


def _invalid(form: forms.Form) -> JsonResponse:
    field, errors = next(iter(form.errors.items()))
    return JsonResponse({"error_code": "invalid", "message": f"{field}: {errors[0]}", "field": field}, status=400)


def _tools() -> list[dict[str, Any]]:
    """Return every registered tool with agentfast.yaml's policy of it: the defaults, and the floor."""
    tools = []
    for tool in sorted(registry, key=lambda tool: tool.name):
        rule = _rule(tool.name)
        tools.append(
            {
                "name": tool.name,
                "description": tool.description,
                "risk": rule.risk,
                "mode": rule.hitl_mode if rule.gated else "suspend",
                # What a composed agent cannot go below: a gated tool stays gated, suspend stays suspend.
                "gated": rule.gated,
                "suspend_only": rule.gated and rule.hitl_mode == "suspend",
            }
        )
    return tools


def _rule(tool_name: str) -> ToolPolicy:
    try:
        return get_policy().tool_policy(tool_name)
    except ConfigError:  # the page says what is wrong with the file
        return UNLISTED


def definition(run: Run) -> dict[str, Any] | None:
    """Return what a run's own agent is (model, prompt, each tool's effective policy), or None for a configured one."""
    if run.agent_config is None:
        return None
    try:
        agent = agent_for(run.agent, run.agent_config)
        policy = get_policy()
    except ConfigError as exc:
        return {"error": str(exc)}
    tools = []
    for name in agent.tools:
        effective = policy.tool_policy(name, agent=agent)
        asked = agent.tool_overrides.get(name)
        tools.append(
            {
                "name": name,
                "risk": effective.risk,
                "mode": effective.hitl_mode if effective.gated else "",
                # agentfast.yaml gates it though the agent did not ask for that (or asked for less).
                "raised": effective.gated
                and (asked is None or not asked.gated or asked.hitl_mode != effective.hitl_mode),
            }
        )
    return {"model": agent.model, "system_prompt": agent.system_prompt, "max_steps": agent.max_steps, "tools": tools}


def _agents() -> tuple[list[AgentSpec], str]:
    """Return the configured agents, or none and why (a broken agentfast.yaml)."""
    try:
        policy = get_policy()
    except ConfigError as exc:
        return [], str(exc)
    return sorted(policy.agents.values(), key=lambda agent: agent.name), ""
