"""The tool registry: a tool is a typed Python function; its JSON schema comes from its signature.

```python
@tool(check=_refund_is_possible)
def refund_request(ctx: ToolContext, order_id: str, amount_cents: int) -> dict: ...
```
`check` runs on validated arguments before anyone is asked; a ToolError from it goes back
to the model and no approval is opened. `summary` is the one line a reviewer reads on the
call's card, e.g. `summary="Refund {amount_cents|money} on {order_id}"`; without one the
card lists the key arguments. A tool may ask a person itself by calling
`feedback_required(payload)` before it does anything; it is then called again, once, with
the reviewer's payload in `ctx.approval_payload`. A call a rule or a grant let through, or whose
scheduled time came (or a reviewer ran now), asked nobody: its tool sees no approval
(`ctx.approval_id` is None), and its question goes to a person as any other. A tool may ask to
run later with
`run_at(when)` (outside business hours, say): the run suspends until then, and the tool is
called again, once, at that time or when a reviewer says "run now"; `run_at` then returns.
A call a person (or a rule, or a grant) already approved keeps that approval and waits for
the time alone: nobody is asked again, and there is no "run now".
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn, get_type_hints

from django.conf import settings
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from agents import text

BUILTIN_TOOL_MODULES = ("agents.tools.demo",)


@dataclass(frozen=True)
class ToolContext:
    run_id: str
    tool_call_id: str
    # Pass it to external systems so that they, too, apply the effect once.
    idempotency_key: str
    approval_id: str | None = None  # the decision a person (or a deadline) made; None: nobody was asked
    approval_payload: dict[str, Any] | None = None
    approval_note: str = ""
    edited: bool = False
    released: bool = False  # a scheduled call whose time came (or a reviewer said run now): run_at returns


class ToolError(Exception):
    """A tool refuses or fails in a way the model should read and adapt to."""

    def __init__(self, message: str, *, code: str = "TOOL_ERROR") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FeedbackRequired(Exception):
    """Raised by a tool, before any side effect, to put a question to a person."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__("feedback required")
        self.payload = payload


def feedback_required(payload: dict[str, Any]) -> NoReturn:
    """Ask a person for a decision with this payload; the tool runs again with their answer."""
    raise FeedbackRequired(payload)


class RunLater(Exception):
    """Raised by a tool, before any side effect, to run at a later time."""

    def __init__(self, when: datetime) -> None:
        super().__init__(f"run later, at {when.isoformat()}")
        self.when = when if when.tzinfo else when.replace(tzinfo=UTC)


# Set while a released scheduled call runs, so that its tool's run_at(...) lets it through.
_released: ContextVar[bool] = ContextVar("agentfast_released", default=False)


def run_at(when: datetime) -> None:
    """Return at once if `when` has come (or the call was released); otherwise suspend the run until then."""
    aware = when if when.tzinfo else when.replace(tzinfo=UTC)
    if _released.get() or aware <= datetime.now(UTC):
        return
    raise RunLater(aware)


class InvalidArguments(Exception):
    """Arguments do not fit the tool's schema; `field` names the first bad one."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    func: Callable[..., Any]
    args_model: type[BaseModel]
    check: Callable[..., None] | None = None
    summary: str = ""

    def summarize(self, arguments: Any) -> str:
        """Return the one-line human summary of a call with these arguments."""
        return summarize(arguments, template=self.summary)

    def parameters_schema(self) -> dict[str, Any]:
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema

    def spec(self) -> dict[str, Any]:
        """Return the OpenAI function-tool description of this tool (built once: pydantic's schema is slow)."""
        return _spec(self)

    def validate(self, arguments: Any, *, strict: bool = False) -> dict[str, Any]:
        """Return the arguments validated against the schema, or raise InvalidArguments.

        A model's proposal is coerced where harmless ("1500" → 1500), but never a boolean
        into a number (true is not a 1-cent refund). `strict` (a reviewer's edit) coerces
        nothing: the JSON types must be the schema's own.
        """
        if not isinstance(arguments, dict):
            raise InvalidArguments(f"arguments of {self.name} must be a JSON object, not {type(arguments).__name__}")
        try:
            if strict:
                # JSON mode, as the arguments came from JSON: strings still fill dates and enums.
                model = self.args_model.model_validate_json(json.dumps(arguments), strict=True)
            else:
                model = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            first = exc.errors()[0]
            field_name = ".".join(str(part) for part in first["loc"])
            raise InvalidArguments(f"{field_name}: {first['msg']}", field=field_name) from None
        validated = model.model_dump(mode="json")
        where = _bool_coerced(arguments, validated)
        if where is not None:
            raise InvalidArguments(f"{where}: a boolean is not a number", field=where)
        return validated

    def check_arguments(self, arguments: dict[str, Any]) -> None:
        """Run the tool's own check before anyone is asked; raises ToolError."""
        if self.check is not None:
            self.check(**arguments)

    def __call__(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        token = _released.set(ctx.released)
        try:
            return self.func(ctx, **arguments)
        finally:
            _released.reset(token)


def _bool_coerced(given: Any, validated: Any, where: str = "") -> str | None:
    """Return where a boolean was turned into something else, or None."""
    if isinstance(given, bool):
        return None if isinstance(validated, bool) else where or "arguments"
    if isinstance(given, dict) and isinstance(validated, dict):
        for key, value in given.items():
            found = _bool_coerced(value, validated.get(key), f"{where}.{key}" if where else str(key))
            if found:
                return found
    if isinstance(given, list) and isinstance(validated, list):
        for index, (value, out) in enumerate(zip(given, validated, strict=False)):
            found = _bool_coerced(value, out, f"{where}[{index}]")
            if found:
                return found
    return None


@functools.cache
def _spec(tool_: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool_.name, "description": tool_.description, "parameters": tool_.parameters_schema()},
    }


@dataclass
class Registry:
    tools: dict[str, Tool] = field(default_factory=dict)

    def add(self, tool_: Tool) -> None:
        existing = self.tools.get(tool_.name)
        if existing is not None and existing.func.__qualname__ != tool_.func.__qualname__:
            raise ValueError(f"two tools are named {tool_.name!r}")
        self.tools[tool_.name] = tool_

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def names(self) -> list[str]:
        return sorted(self.tools)

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools.values())


registry = Registry()


def tool(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    check: Callable[..., None] | None = None,
    summary: str = "",
) -> Any:
    """Register a function as a tool; its first parameter receives the ToolContext."""

    def register(fn: Callable[..., Any]) -> Tool:
        tool_ = Tool(
            name=name or fn.__name__,
            description=description or inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0],
            func=fn,
            args_model=_arguments_model(fn),
            check=check,
            summary=summary,
        )
        registry.add(tool_)
        return tool_

    return register(func) if func is not None else register


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:\|([a-z]+))?\}")
SUMMARY_KEYS = 3  # arguments listed by the fallback summary
SUMMARY_VALUE_CHARS = 40


def summarize(arguments: Any, *, template: str = "") -> str:
    """Fill a tool's summary template from the arguments, or list the first few key arguments.

    `{name}` is the value, `{name|money}` cents as "25.00", `{name|date}` an ISO date as
    "2 Dec 2026". A missing or unreadable value leaves the template for the fallback.
    """
    # Stored arguments may predate the text rules: a summary is shown, so it must always be text.
    values = text.repair(arguments) if isinstance(arguments, dict) else {}
    if template:
        try:
            return _PLACEHOLDER.sub(lambda match: _formatted(values, match.group(1), match.group(2)), template)
        except (KeyError, TypeError, ValueError):
            pass
    parts = [f"{key}: {_short(value)}" for key, value in list(values.items())[:SUMMARY_KEYS]]
    return " · ".join(parts) + (" …" if len(values) > SUMMARY_KEYS else "")


def _formatted(values: dict[str, Any], name: str, style: str | None) -> str:
    value = values[name]
    if style == "money":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(name)
        return format_money(value)
    if style == "date":
        return format_date(str(value))
    if style is not None:
        raise ValueError(style)
    return _short(value)


def format_money(cents: int) -> str:
    """Return cents as "2,500.00" (a minus sign first for a negative amount)."""
    sign = "-" if cents < 0 else ""
    whole, part = divmod(abs(cents), 100)
    return f"{sign}{whole:,}.{part:02d}"


def format_date(value: str) -> str:
    """Return an ISO date or datetime as "2 Dec 2026" (with "14:05" for a datetime); other text as is."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return _short(value)
    day = f"{moment.day} {moment:%b %Y}"
    return day if len(value) <= 10 else f"{day} {moment:%H:%M}"


def _short(value: Any) -> str:
    shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return shown if len(shown) <= SUMMARY_VALUE_CHARS else shown[: SUMMARY_VALUE_CHARS - 1] + "…"


def _arguments_model(fn: Callable[..., Any]) -> type[BaseModel]:
    hints = get_type_hints(fn, include_extras=True)
    params = list(inspect.signature(fn).parameters.values())[1:]  # the first is ctx
    fields: dict[str, Any] = {}
    for param in params:
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hints.get(param.name, Any), default)
    config = ConfigDict(extra="forbid")
    return create_model(f"{fn.__name__}_arguments", __config__=config, **fields)


def load_tool_modules() -> None:
    """Import the built-in tools and those AGENTFAST_TOOL_MODULES names, registering them."""
    for module in BUILTIN_TOOL_MODULES:
        importlib.import_module(module)
    for module in settings.AGENTFAST_TOOL_MODULES:
        _import_named(module)


def _import_named(module: str) -> None:
    """Import a module AGENTFAST_TOOL_MODULES names; a name that finds no module stops the process in one line.

    Only a missing module itself (or its package) is said in one line: an import failing inside
    the operator's own module keeps its traceback, which shows where.
    """
    from django.core.exceptions import ImproperlyConfigured

    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if not exc.name or not f"{module}.".startswith(f"{exc.name}."):
            raise
        raise ImproperlyConfigured(f"AGENTFAST_TOOL_MODULES: {module!r} cannot be imported ({exc})") from None
    except TypeError as exc:  # a relative name (".tools") has no package to be relative to
        raise ImproperlyConfigured(f"AGENTFAST_TOOL_MODULES: {module!r} cannot be imported ({exc})") from None
