"""Slack's Approve and Reject buttons: signed requests, mapped to agentfast users, decided by the same service."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import time
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache, caches
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from redis.exceptions import RedisError

from agents import services, text
from agents.models import Approval, AuditEntry
from agents.notify.channels import DECISION_BLOCK, slack_outcome, slack_reply, slack_secret_problem
from agents.notify.models import Delivery, SlackLink
from agents.notify.tasks import deliver
from agents.services import notify as notify_services
from agents.services.notify import Target
from dashboard.auth import client_address, ip_of, is_reviewer
from dashboard.integrations.outcome import outcome_line, vote_line

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 5 * 60  # Slack's advice: refuse a request signed longer ago than this
# Anyone can POST here, and a refused request names nobody: audited each time, a stream of them
# would fill the audit and take the audit chain's lock, which every decision waits on, once each.
# The first refusal from a sender (an address; for IPv6, its /64) in this many seconds is
# audited; the others are logged.
REFUSED_AUDIT_SECONDS = 60


class Refused(Exception):
    """A request that is not (or no longer) Slack's own; the message goes to the audit."""


@csrf_exempt  # signed by Slack instead; a browser's cookies give it nothing
@require_POST
def actions(request: HttpRequest) -> HttpResponse:
    """Decide from a Slack button, and show who decided in the message through its response_url."""
    address = client_address(request)
    origin = f"slack {address}"
    try:
        _verify(request)
        action = _action(request)
    except Refused as exc:
        _audit_refused(origin, address, str(exc))
        return JsonResponse({"error": str(exc)}, status=403)
    headline, settled = _decide(action, origin)
    # Only a decision that stands replaces the channel's message: a refusal (an unlinked
    # Slack user, a reviewer outside the approvers) is told to the presser alone, and the
    # buttons stay for the people who may press them.
    if settled:
        _update_message(action["response_url"], headline)
    return JsonResponse(slack_reply(headline))


def _audit_refused(origin: str, address: str, reason: str) -> None:
    """Audit a refused request, unless one from the same sender was audited within REFUSED_AUDIT_SECONDS."""
    if not _first_refusal(address):
        logger.warning("refused a Slack request from %s (audited once a minute a sender): %s", address, reason)
        return
    notify_services.audit_refused_request(
        attempt=services.Attempt(actor="(slack, unverified)", source=AuditEntry.Source.SLACK, origin=origin),
        action="slack_action",
        reason=reason,
    )


def _first_refusal(address: str) -> bool:
    """Return whether no refusal from this sender was audited within REFUSED_AUDIT_SECONDS, and count this one.

    In Redis, shared by every web process; while Redis does not answer, in this process's memory.
    """
    key = f"slack-refused:{_sender(address)}"
    try:
        return cache.add(key, True, REFUSED_AUDIT_SECONDS)
    except RedisError:
        return caches["local"].add(key, True, REFUSED_AUDIT_SECONDS)


def _sender(address: str) -> str:
    """Return who sent from this address, as far as a limit can tell: an IPv6 address's /64.

    One host is commonly given a whole /64 and may send from any address in it: counted
    apart, each would have its refusal audited every minute.
    """
    ip = ip_of(address)
    if ip is None:
        return address
    if isinstance(ip, ipaddress.IPv6Address):  # ip_of reads ::ffff:a.b.c.d as the IPv4 host a.b.c.d
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def _verify(request: HttpRequest) -> None:
    """Check Slack's v0 signature over the timestamp and the raw body, its age, and that it is new."""
    problem = slack_secret_problem()
    if problem:
        raise Refused(f"{problem}: no Slack request can be verified")
    secret = settings.AGENTFAST_SLACK_SIGNING_SECRET
    stamp = request.headers.get("X-Slack-Request-Timestamp", "")
    signature = request.headers.get("X-Slack-Signature", "")
    # ASCII digits, and few: isdigit() alone admits "²", and int() refuses over 4,300 digits.
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12) or abs(time.time() - int(stamp)) > WINDOW_SECONDS:
        raise Refused("the request is older than 5 minutes (or has no timestamp)")
    base = b"v0:" + stamp.encode() + b":" + request.body
    expected = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    # As bytes: compare_digest raises on a str beyond ASCII, which any sender may put in the header.
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "surrogateescape")):
        raise Refused("bad signature")
    if not notify_services.slack_request_remember(signature=signature):
        raise Refused("replayed request (this signature was already used)")


def _action(request: HttpRequest) -> dict[str, Any]:
    """Return the button pressed, who pressed it, and where to update the message."""
    try:
        payload = text.loads_strict(request.POST.get("payload", ""), field="payload")
        pressed = payload["actions"][0]
        action = {
            "decision": str(pressed["action_id"]),
            "approval_id": str(pressed["value"]),
            "slack_id": str(payload["user"]["id"]),
            "response_url": str(payload.get("response_url") or ""),
            "expect_digest": _shown_digest(pressed.get("block_id")),
        }
    except (text.UnsafeText, ValueError, KeyError, IndexError, TypeError):
        raise Refused("not a Slack block action") from None
    if action["decision"] not in ("approved", "rejected"):
        raise Refused(f"unknown action {action['decision'][:40]!r}")
    if action["response_url"] and urlparse(action["response_url"]).scheme not in ("http", "https"):
        raise Refused("response_url is not an http(s) URL")
    return action


def _shown_digest(block_id: object) -> str:
    """Return the digest of the arguments the pressed message showed ("" for a message posted without one)."""
    prefix = f"{DECISION_BLOCK}:"
    if isinstance(block_id, str) and block_id.startswith(prefix):
        return block_id.removeprefix(prefix)[:64]
    return ""


def _decide(action: dict[str, Any], origin: str) -> tuple[str, bool]:
    """Decide as the linked agentfast user; return what to say, and whether the call's fate is settled."""
    user = _user_for(action["slack_id"])
    actor = user.username if user else f"slack:{action['slack_id']}"
    attempt = services.Attempt(actor=actor, source=AuditEntry.Source.SLACK, origin=origin)
    if user is None or not is_reviewer(user):
        services.approval_refuse(
            approval_id=action["approval_id"],
            decision=action["decision"],
            attempt=attempt,
            outcome=AuditEntry.Outcome.NOT_PERMITTED,
            reason="Slack user not linked to a reviewer",
        )
        return (
            f"Slack user {action['slack_id']} is not linked to an agentfast reviewer "
            f"(agentfast users link-slack NAME {action['slack_id']})"
        ), False
    try:
        decision = services.approval_decide(
            approval_id=action["approval_id"],
            decision=action["decision"],
            attempt=attempt,
            expect_digest=action["expect_digest"],  # an edit since the message was posted: its buttons are stale
        )
    except (services.AlreadyDecided, services.WrongState) as exc:
        return outcome_line(exc.details["approval"]), True
    except services.ServiceError as exc:  # not found, invalid, not among the approvers (audited by the service)
        return f"{user.username}: {exc.message}", False
    approval: Approval = decision.approval
    if approval.status == Approval.Status.PENDING:
        # A vote short of the quorum (or the same vote again): the message keeps its buttons for the others.
        return vote_line(approval, attempt.decider), False
    return f"{approval.tool} was {approval.status} by {approval.decided_by}", True


def _user_for(slack_id: str) -> User | None:
    link = SlackLink.objects.select_related("user").filter(slack_id=slack_id).first()
    return link.user if link and link.user.is_active else None


def _update_message(response_url: str, headline: str) -> None:
    """Replace the clicked message through its response_url, from a worker, retried like any delivery."""
    if not response_url:
        return
    ids = notify_services.deliveries_open(
        event_type="slack.update",
        approval_id="",
        targets=[Target(Delivery.Kind.SLACK_RESPONSE, response_url, slack_outcome(headline))],
    )
    for delivery_id in ids:
        deliver.delay_on_commit(delivery_id)
