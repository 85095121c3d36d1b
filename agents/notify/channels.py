"""How each kind of delivery is sent: a signed webhook, a mail, a chat message."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
from django.conf import settings
from django.contrib.auth.models import User
from django.core import signing
from django.core.mail import EmailMultiAlternatives, get_connection
from django.template.loader import render_to_string
from standardwebhooks.webhooks import Webhook

from agents.models import arguments_digest
from agents.notify import payloads
from agents.notify.config import SlackChannel, WebhookChannel
from agents.notify.models import Delivery
from agents.policy.config import get_policy
from agents.services import eligibility

TIMEOUT = httpx.Timeout(10.0, connect=5.0)
# The whole of one HTTP attempt. TIMEOUT bounds each read, not their sum: a receiver sending a
# byte every few seconds would hold a worker's thread for ever (Celery's time limits do not
# apply to the threads pool), and the sweeper starts another attempt each minute.
ATTEMPT_SECONDS = 30.0
# An answer's body is read only this far, and only this long, after its status.
DRAIN_BYTES = 64 * 1024
DRAIN_SECONDS = 1.0
# Standard Webhooks' shortest secret: a key anyone can guess lets anyone sign events receivers accept.
MIN_SECRET_BYTES = 24
# Slack's signing secrets are 32 hex characters: a shorter one was typed by hand ("changeme"), and a
# guessed secret signs presses that decide as any linked reviewer.
MIN_SLACK_SECRET_CHARS = 32
ONE_CLICK_SALT = "agentfast.notify.one-click"
ONE_CLICK_MAX_AGE = 24 * 3600
USER_AGENT = "agentfast-notify/1"
# Slack refuses a section longer than this (invalid_blocks): the message would never land, however often retried.
SECTION_CHARS = 3000
DECISION_BLOCK = "agentfast_decision"


class NotSendable(Exception):
    """The delivery cannot be sent as configured (a missing secret, an unknown recipient)."""


def send(delivery: Delivery) -> int | None:
    """Send a delivery once; return the receiver's HTTP status (None for a mail the backend took)."""
    if delivery.kind == Delivery.Kind.WEBHOOK:
        return _webhook(delivery)
    if delivery.kind == Delivery.Kind.EMAIL:
        _email(delivery)
        return None
    if delivery.kind == Delivery.Kind.SLACK:
        return _post_json(_env(delivery.target), slack_message(delivery.payload))
    if delivery.kind == Delivery.Kind.SLACK_RESPONSE:
        return _post_json(delivery.target, delivery.payload)
    raise NotSendable(f"unknown kind {delivery.kind!r}")


def _env(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise NotSendable(f"the environment variable {name} is not set")
    return value


def _post_json(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> int:
    content = json.dumps(body, ensure_ascii=False)
    return _post(url, content.encode(), {"content-type": "application/json", **(headers or {})})


def _post(url: str, content: bytes, headers: dict[str, str]) -> int:
    """POST once and return the receiver's status, or raise TimeoutError after ATTEMPT_SECONDS in all."""
    return anyio.run(_post_within, url, content, {"user-agent": USER_AGENT, **headers}, ATTEMPT_SECONDS)


async def _post_within(url: str, content: bytes, headers: dict[str, str], seconds: float) -> int:
    try:
        with anyio.fail_after(seconds):
            async with (
                httpx.AsyncClient(timeout=TIMEOUT) as client,
                # Only the status counts: a slow or endless body (a URL pointing at a download)
                # must neither fail an answered attempt nor fill the worker.
                client.stream("POST", url, content=content, headers=headers) as response,
            ):
                await _drain(response)
                return response.status_code
    except TimeoutError:
        raise TimeoutError(f"the receiver's answer took longer than {seconds:g} s") from None


async def _drain(response: httpx.Response) -> None:
    """Read what a short answer holds, briefly, so the connection closes cleanly (one closed with
    unread bytes is reset, which receivers log as an error); never more than DRAIN_BYTES."""
    read = 0
    with anyio.move_on_after(DRAIN_SECONDS), contextlib.suppress(httpx.HTTPError):
        async for chunk in response.aiter_raw():
            read += len(chunk)
            if read >= DRAIN_BYTES:
                return


# -- webhooks ------------------------------------------------------------------------------


def _webhook(delivery: Delivery) -> int:
    secret = _webhook_secret(delivery.target)
    body = json.dumps(delivery.payload, ensure_ascii=False)
    headers = sign(secret, delivery.webhook_id, body)
    return _post(delivery.target, body.encode(), {"content-type": "application/json", **headers})


def sign(secret: str, message_id: str, body: str) -> dict[str, str]:
    """Return the Standard Webhooks headers of a body: webhook-id, webhook-timestamp, webhook-signature."""
    now = datetime.now(tz=UTC)
    signature = Webhook(secret).sign(message_id, now, body)
    return {"webhook-id": message_id, "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}


def _webhook_secret(url: str) -> str:
    """Return the secret of the configured webhook with this URL (read now: a rotated secret applies at once)."""
    for channel in get_policy().notifications:
        if isinstance(channel, WebhookChannel) and channel.url == url:
            secret = _env(channel.secret_env)
            if not _strong(secret):
                raise NotSendable(
                    f"{channel.secret_env} must hold a whsec_ secret: at least {MIN_SECRET_BYTES} bytes in base64 "
                    "(a shorter key is guessed, and its signatures prove nothing)"
                )
            return secret
    raise NotSendable(f"no webhook for {url} in the configuration any more")


def configuration_problems() -> list[str]:
    """Return what will make the configured notifications fail, for the commands that start the site to say.

    Only said, never fatal: the approvals work without their notifications, and a delivery that
    fails for it is kept and retried, so setting the variable and restarting sends it.
    """
    problems = []
    for index, channel in enumerate(get_policy().notifications):
        where = f"notifications[{index}] ({channel.kind})"
        try:
            if isinstance(channel, WebhookChannel):
                _webhook_secret(channel.url)
            elif isinstance(channel, SlackChannel):
                _env(channel.webhook_url_env)
        except NotSendable as exc:
            problems.append(f"{where}: {exc}; its deliveries fail until it is")
        if isinstance(channel, SlackChannel) and (problem := slack_secret_problem()):
            problems.append(f"{where}: {problem}; presses of its buttons are refused")
    return problems


def slack_secret_problem() -> str:
    """Return why no Slack request can be trusted with the configured signing secret, or "" when it can."""
    secret = settings.AGENTFAST_SLACK_SIGNING_SECRET
    if not secret:
        return "SLACK_SIGNING_SECRET is not set"
    if len(secret) < MIN_SLACK_SECRET_CHARS:
        return (
            f"SLACK_SIGNING_SECRET is shorter than Slack's ({MIN_SLACK_SECRET_CHARS} characters): "
            "a guessed secret signs any request"
        )
    return ""


def _strong(secret: str) -> bool:
    """Return whether a webhook secret is whsec_ and strict base64 of a key as long as Standard Webhooks asks."""
    if not secret.startswith("whsec_"):
        return False
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        return False  # the signing library reads past bad characters: "whsec_!!" would sign with an empty key
    return len(key) >= MIN_SECRET_BYTES


# -- email ---------------------------------------------------------------------------------


def _email(delivery: Delivery) -> None:
    user = User.objects.filter(username=delivery.target, is_active=True).first()
    if user is None or not user.email:
        raise NotSendable(f"{delivery.target} has no email address (agentfast users create … --email)")
    if eligibility.refusal_of_role(user) is not None:  # the role ended since the event: the call is not theirs to read
        raise NotSendable(f"{delivery.target} is no longer a reviewer")
    context = email_context(delivery.payload, user.username)
    # One line: a recorded name (the CLI's --by) may hold a line break, which no header may carry.
    subject = payloads.one_line(f"[agentfast] {payloads.headline(delivery.payload)}")
    text_body = render_to_string("dashboard/integrations/email.txt", context)
    html_body = render_to_string("dashboard/integrations/email.html", context)
    message = EmailMultiAlternatives(
        subject,
        text_body,
        to=[user.email],
        headers={"X-Agentfast-Id": delivery.webhook_id},
        connection=get_connection(timeout=_mail_seconds()),
    )
    message.attach_alternative(html_body, "text/html")
    message.send()


def _mail_seconds() -> float:
    """Return how long the mail server may take to answer: as an HTTP attempt, or less when EMAIL_TIMEOUT says so.

    Django waits for ever by default: a silent server would hold a worker's thread, and once the
    delivery's claim ran out the sweeper would send the same mail again beside it.
    """
    configured = getattr(settings, "EMAIL_TIMEOUT", None)
    return min(configured, ATTEMPT_SECONDS) if configured else ATTEMPT_SECONDS


def email_context(payload: dict[str, Any], username: str) -> dict[str, Any]:
    data = payload["data"]
    context: dict[str, Any] = {
        "headline": payloads.headline(payload),
        "data": data,
        "arguments": payloads.arguments_json(data["arguments"], indent=2),
        "pending": payload["type"] in payloads.WAITING,
        "answer": payloads.asks_answer(payload),
        # The plain-text part shows what people and models wrote on one line each: a prompt's own
        # line breaks could otherwise draw a "One-click … Approve: <link>" section of its own.
        "prompt_line": payloads.one_line(str(data.get("prompt") or ""), limit=500),
        "description_line": payloads.one_line(str(data.get("description") or ""), limit=500),
        "note_line": payloads.one_line(str(data.get("note") or "")),
        # And every name on one line: a name recorded through the CLI's --by may hold line breaks.
        "agent_line": payloads.one_line(str(data.get("agent") or "")),
        "requested_line": payloads.one_line(str(data.get("requested_by") or "")),
        "decided_line": payloads.one_line(str(data.get("decided_by") or "")),
    }
    decisions = payloads.click_decisions(payload)
    if payload.get("one_click") and decisions:
        context["links"] = one_click_links(data["approval_id"], username, data["arguments"], decisions)
    return context


def one_click_links(approval_id: str, username: str, arguments: Any, decisions: tuple[str, ...]) -> dict[str, str]:
    """Return signed, single-use links to the decisions, bound to the approval, the person and the arguments."""
    from agents.services import notify as notify_services

    nonce = notify_services.oneclick_issue(approval_id=approval_id, username=username)
    digest = arguments_digest(arguments)
    links = {}
    for decision in decisions:
        token = signing.dumps(
            {"a": approval_id, "u": username, "d": digest, "n": nonce, "k": decision}, salt=ONE_CLICK_SALT
        )
        links[decision] = f"{payloads.base_url()}/integrations/email/{token}"
    return links


# -- chat ----------------------------------------------------------------------------------


def slack_message(payload: dict[str, Any]) -> dict[str, Any]:
    """Return a Block Kit message: the call in plain words, with the buttons of its decisions while it waits.

    What people and models wrote stands on one line each, as in a mail's plain text: a prompt's
    own line breaks could otherwise lay out lines that pass for the message's ("approved by …").
    """
    data = payload["data"]
    page = "Answer it in agentfast" if payloads.asks_answer(payload) else "Open in agentfast"
    head = f"`{_mrkdwn(data['tool'])}` "
    # .get: a delivery stored before payloads carried the description has none.
    said = (
        f"\nWhat it does, in the agent's words: {_mrkdwn_within(payloads.one_line(data['description']), 300)}"
        if data.get("description")
        else ""
    )
    asker = payloads.one_line(data["requested_by"] or "") or "an agent"
    tail = (
        f"{said}\nAsked by {_mrkdwn(asker)} in run {data['run_id']}: "
        f"_{_mrkdwn(payloads.one_line(data['prompt'])[:300])}_\n<{data['url']}|{page}>"
    )
    arguments = payloads.arguments_json(data["arguments"])
    call = head + _mrkdwn_within(arguments, SECTION_CHARS - len(head) - len(tail)) + tail
    blocks: list[dict[str, Any]] = [_section(f"*{_mrkdwn(payloads.headline(payload))}*"), _section(call)]
    if decisions := payloads.click_decisions(payload):
        elements = [_button(decision, data["approval_id"]) for decision in decisions]
        blocks.append({"type": "actions", "block_id": decision_block_id(payload), "elements": elements})
    # The fallback text is mrkdwn too (and what notifications show): a name in it must not page a channel.
    return {"text": _mrkdwn(payloads.headline(payload)), "blocks": blocks}


def _section(mrkdwn: str) -> dict[str, Any]:
    """Return a section of escaped mrkdwn that Slack shows verbatim.

    Verbatim, Slack still reads the message's own markup (its link, bold, code) but adds none to
    the text: a URL in the arguments or a prompt is not made a link, "#general" a channel's, nor
    a mention parsed out of plain words (Block Kit's text object, `verbatim`).
    """
    return {"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn, "verbatim": True}}


def decision_block_id(payload: dict[str, Any]) -> str:
    """Return the buttons' block id: it carries the digest of the arguments shown, which a press must still match."""
    data = payload["data"]
    # .get: a delivery stored before payloads carried the digest shows the arguments it stored.
    digest = data.get("arguments_digest") or arguments_digest(data["arguments"])
    return f"{DECISION_BLOCK}:{digest}"


def slack_outcome(headline: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the replacement of a clicked message: what became of the call, without buttons."""
    line = _mrkdwn(payloads.one_line(headline))
    return {"replace_original": True, "text": line, "blocks": [_section(line)]}


def slack_reply(headline: str) -> dict[str, Any]:
    """Return the answer only the presser sees; mrkdwn too, so names and messages in it are escaped."""
    return {"text": _mrkdwn(payloads.one_line(headline)), "response_type": "ephemeral"}


_BUTTONS = {"approved": ("Approve", "primary"), "rejected": ("Reject", "danger")}


def _button(decision: str, approval_id: str) -> dict[str, Any]:
    label, style = _BUTTONS[decision]
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": label},
        "style": style,
        "action_id": decision,
        "value": approval_id,
    }


def _mrkdwn(value: str) -> str:
    """Escape what Slack's mrkdwn treats as markup (its documented three characters)."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _mrkdwn_within(value: str, limit: int) -> str:
    """Escape for mrkdwn in at most `limit` characters, cut between entities and marked with "…"."""
    escaped = _mrkdwn(value)
    if len(escaped) <= limit:
        return escaped
    pieces, size = [], 0
    for char in value:
        piece = _mrkdwn(char)
        if size + len(piece) > limit - 1:
            break
        pieces.append(piece)
        size += len(piece)
    return "".join(pieces) + "…"
