"""Live pushes to reviewers' browsers: inbox cards and run timelines, as htmx partials.

The engine sends `{"type": "run.event", ...}` to the Channels groups after commit
(agents.events); these consumers turn each event into the same partial a page load
renders, marked for an out-of-band swap that htmx's ws extension applies.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import random
import time
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

import redis
from asgiref.sync import async_to_sync
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer, WebsocketConsumer
from django.conf import settings
from django.db.models import QuerySet
from django.http import QueryDict
from django.template.loader import render_to_string

from agents import events, selectors, services, text
from agents.models import Approval, RunEvent
from agents.services import eligibility
from dashboard.auth import is_reviewer, session_holds
from dashboard.live import wire
from dashboard.live.hub import Hub, Shared
from dashboard.web.forms import InboxFilter
from dashboard.web.inbox import INBOX_COUNT_CAP, describe_cards, pending_count_context

T = TypeVar("T")
logger = logging.getLogger(__name__)

FORBIDDEN = 4403  # the websocket close code that says "not for you" (HTTP 403)
NOT_FOUND = 4404
BAD_REQUEST = 4400  # a filter that is not valid text (HTTP 400, as the page answers)
# An expired or deleted session (or user) sends no access.check: open sockets re-check this often.
RECHECK_SECONDS = 300.0


class _GroupConsumer(WebsocketConsumer):
    """Accept reviewers only, then join one group; subclasses name it and render events.

        Nothing the browser sends is read: decisions go through the views (CSRF, audit). Each
    socket also joins its user's access group and closes (4403) when that access ends.
    """

    group: str = ""

    def connect(self) -> None:
        # Closing before accept refuses the handshake (daphne answers 403).
        if not is_reviewer(self.scope["user"]):
            self.close(code=FORBIDDEN)
            return
        group = self.group_to_join()
        if group is None:
            self.close(code=NOT_FOUND)
            return
        self.groups_joined = [group, events.user_group(self.scope["user"].pk)]
        for name in self.groups_joined:
            async_to_sync(self.channel_layer.group_add)(name, self.channel_name)
        self.group = group
        self.recheck_at = time.monotonic() + RECHECK_SECONDS
        self.accept()

    def disconnect(self, code: int) -> None:
        for name in getattr(self, "groups_joined", []):
            async_to_sync(self.channel_layer.group_discard)(name, self.channel_name)

    def access_check(self, message: dict[str, Any]) -> None:
        """Close when the user's access ended: this session logged out, or a re-check fails."""
        session_key = self.scope["session"].session_key
        if (
            message.get("session") and message["session"] == events.session_digest(session_key)
        ) or not _may_still_watch(self.scope["user"].pk, session_key):
            self.close(code=FORBIDDEN)

    def group_to_join(self) -> str | None:
        """Read the connection's parameters; return the group to join, or None (4404)."""
        raise NotImplementedError

    def push(self, html: str) -> None:
        """Send a partial, unless access ended unannounced; a lone surrogate is repaired, never fatal."""
        if time.monotonic() >= self.recheck_at:
            if not _may_still_watch(self.scope["user"].pk, self.scope["session"].session_key):
                self.close(code=FORBIDDEN)
                return
            self.recheck_at = time.monotonic() + RECHECK_SECONDS
        self.send(text_data=text.repair(html))


def _query(scope: dict[str, Any]) -> QueryDict:
    """Return the handshake's query parameters; a client's bytes that are not UTF-8 are read as Latin-1, never raising."""
    return QueryDict(scope["query_string"])  # QueryDict's own fallback for bytes


def _may_still_watch(user_id: int, session_key: str | None) -> bool:
    user = selectors.user_get_active(user_id)
    return user is not None and is_reviewer(user) and session_holds(user, session_key)


class UnknownPathConsumer(WebsocketConsumer):
    """Refuse a websocket to a path no route serves (4404), as a page would answer 404."""

    def connect(self) -> None:
        self.close(code=NOT_FOUND)


class InboxConsumer(AsyncWebsocketConsumer):
    """Push new approvals as cards and remove decided ones, in every open inbox.

    Thousands of inboxes may be open on one process, so a push costs each of them no
    table read and no thread: every inbox of the process is fed by one subscription
    (dashboard.live.hub), what an event shows is worked out once (`_InboxPush`), per reviewer
    where it depends on who looks, and each socket only picks its variant and sends it.
    """

    async def connect(self) -> None:
        user = self.scope["user"]
        # Closing before accept refuses the handshake (daphne answers 403).
        if not await database_sync_to_async(is_reviewer)(user):
            await self.close(code=FORBIDDEN)
            return
        # The role eligibility asks for, read once: a role taken away closes the socket
        # (access.check), so it holds while the socket is open.
        self.may_decide_any = eligibility.refusal_of_role(user) is None  # permissions cached on the user just now
        if text.undecodable_parameter(self.scope["query_string"]) is not None:
            await self.close(code=BAD_REQUEST)  # a filter read as U+FFFD would show no card, unsaid
            return
        params = _query(self.scope)
        # "For me" is this connection's user's: each socket shows its own cards.
        self.filters = InboxFilter(params, user=user)
        valid = self.filters.is_valid()
        self.count_key = (
            self.filters.for_me,
            self.filters.cleaned_data["agent"] if valid else "",
            self.filters.cleaned_data["tool"] if valid else "",
            self.filters.search,
        )
        # Newest first: a new card slides in at the top of the first page. Oldest first: at the
        # bottom of the last page. Other pages would show it out of order.
        first_page = params.get("page", "1") in ("", "1")
        last_page = params.get("last", "1" if first_page else "0") == "1"
        self.insert_at = "afterbegin" if self.filters.ordering == selectors.NEWEST else "beforeend"
        self.inserts = first_page if self.insert_at == "afterbegin" else last_page
        self.groups_joined = [events.user_group(user.pk)]
        for name in self.groups_joined:
            await self.channel_layer.group_add(name, self.channel_name)
        self.live = False
        await Hub.join(events.APPROVALS_GROUP, self, self.channel_layer)
        await self.accept()
        self.socket = wire.daphne_websocket(self.base_send)
        self.live = True
        self.rechecking = asyncio.ensure_future(self._recheck())

    async def disconnect(self, code: int) -> None:
        self.live = False
        if hasattr(self, "rechecking"):
            self.rechecking.cancel()
        await Hub.leave(events.APPROVALS_GROUP, self)
        for name in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(name, self.channel_name)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch, without its close_old_connections() hop before every message.

        That hop (a thread round trip per socket per push) was two thirds of the web
        process's time with thousands of inboxes open. This consumer reads the database only
        through database_sync_to_async, which closes stale connections in its own thread.
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def access_check(self, message: dict[str, Any]) -> None:
        """Close when the user's access ended: this session logged out, or a re-check fails."""
        session_key = self.scope["session"].session_key
        if (message.get("session") and message["session"] == events.session_digest(session_key)) or not (
            await database_sync_to_async(_may_still_watch)(self.scope["user"].pk, session_key)
        ):
            self.live = False  # no card goes out between the close and the disconnect
            await self.close(code=FORBIDDEN)

    async def _recheck(self) -> None:
        """Re-check access now and then, at times spread out so that thousands of inboxes do not read at once."""
        while self.live:
            await asyncio.sleep(RECHECK_SECONDS * random.uniform(0.5, 1.0))  # noqa: S311 — not a secret
            try:
                await self.access_check({})
            except Exception:  # the database is away: keep the socket, try again next time
                logger.warning("could not re-check a live inbox's access", exc_info=True)

    @classmethod
    async def prepare(cls, event: Shared) -> None:
        """Read the approval (or render its removal) before any inbox asks."""
        message = event.message
        if message.get("type") != "run.event" or message.get("event") not in _INBOX_EVENTS:
            return
        push = _InboxPush.of(event)
        if message["event"] == RunEvent.Type.APPROVAL_DECIDED:
            await push.once(("decided",), _decided_html, push.approval_id)
        else:
            await push.once(("approval",), _described_approval, push.approval_id)

    async def deliver(self, event: Shared) -> None:
        """Send what this inbox shows of an approval event (the hub calls it for every open inbox)."""
        message = event.message
        if not self.live or message.get("type") != "run.event" or message.get("event") not in _INBOX_EVENTS:
            return
        push = _InboxPush.of(event)
        # What a socket shows depends on its user and filters only: the same user's other
        # inboxes with the same filters take the frame worked out for the first.
        view = ("inbox-view", self.scope["user"].pk, self.may_decide_any, self.count_key, self.inserts, self.insert_at)
        frame = await event.once_async(view, lambda: self._frame(push, message))
        if frame is not None:
            await self._send_frame(push, frame)

    async def _frame(self, push: _InboxPush, message: dict[str, Any]) -> str | None:
        html: str | None
        if message["event"] == RunEvent.Type.APPROVAL_DECIDED:
            html = await push.once(("decided",), _decided_html, push.approval_id)
        else:
            html = await self._card(push, replace=message["event"] == RunEvent.Type.APPROVAL_VOTED)
        return None if html is None else push.frame(html, await self._count(push))

    async def _send_frame(self, push: _InboxPush, frame: str) -> None:
        """Send a frame; under daphne, the same websocket frame, encoded once, to every socket."""
        if self.socket is None:
            await self.send(text_data=frame)
            return
        protocol, server = self.socket
        if protocol.state != protocol.STATE_OPEN or server.connections.get(protocol, {}).get("disconnected"):
            return  # closing: daphne would drop it too
        if protocol._perMessageCompress is not None:  # compressed per socket: no frame to share
            await self.send(text_data=frame)
            return
        wire.write_now(protocol.transport, push.prepared(frame, protocol.factory).payloadHybi)

    def lost(self) -> None:
        """The process lost the channel layer: close, so the browser reconnects (and re-fetches)."""
        if self.live:
            self.live = False
            asyncio.ensure_future(self.close(code=1011))

    async def _card(self, push: _InboxPush, *, replace: bool) -> str | None:
        """The new card to insert, or (a vote) the card to swap in where it is shown; None: nothing."""
        approval = await push.once(("approval",), _described_approval, push.approval_id)
        # Decided already (a fast reviewer) or filtered out: nothing to add.
        if approval is None or approval.status != Approval.Status.PENDING:
            return None
        if not replace and not self.inserts:
            return None
        decidable = await self._may_decide(push, approval)
        if self.filters.for_me and not decidable:
            return None
        _for_me, agent, tool, search = self.count_key
        if (agent and approval.run.agent != agent) or (tool and approval.tool != tool):
            return None
        if search and not await push.once(("search", search), selectors.approval_matches, approval.pk, search):
            return None
        # htmx swaps a voted card only where it is on the page; a new one goes in at one end.
        variant = ("card", decidable, replace, None if replace else self.insert_at)
        return await push.once(variant, _card_html, approval, decidable, replace, self.insert_at)

    async def _may_decide(self, push: _InboxPush, approval: Approval) -> bool:
        if not self.may_decide_any:
            return False
        groups = await self._groups(push) if approval.approvers else set()
        return eligibility.restriction(self.scope["user"], approval, groups) is None

    async def _groups(self, push: _InboxPush) -> set[str]:
        """This user's groups, read once per event for all of their sockets."""
        user = self.scope["user"]
        return await push.once(("groups", user.pk), eligibility.group_names, user)

    async def _count(self, push: _InboxPush) -> int:
        """How many approvals this inbox lists now, as the page counts them: up to INBOX_COUNT_CAP + 1 ("500+")."""
        for_me, *rest = self.count_key
        total, restricted = await push.once(("count", *self.count_key), _pending_counts, *self.count_key)
        if not for_me:
            return total
        if not self.may_decide_any:
            return 0
        user = self.scope["user"]
        if restricted is None:  # too many to sort out in Python: this reviewer's own bounded count
            return await push.once(("count for", user.pk, *rest), _decidable_count, user, *rest)
        groups = await self._groups(push) if any(approval.approvers for approval in restricted) else set()
        mine = sum(eligibility.restriction(user, approval, groups) is None for approval in restricted)
        return min(total + mine, INBOX_COUNT_CAP + 1)


_INBOX_EVENTS = {RunEvent.Type.APPROVAL_REQUIRED, RunEvent.Type.APPROVAL_VOTED, RunEvent.Type.APPROVAL_DECIDED}


class _InboxPush:
    """One approval event as the inboxes of this process show it: each part read or rendered once.

    The parts live on the hub's shared event, keyed by what they depend on (the approval; a
    reviewer's groups; a filter's count; a card variant), so every socket that needs one
    awaits the same read or takes the same string.
    """

    def __init__(self, event: Shared) -> None:
        self.event = event
        self.approval_id: str = event.message["data"]["approval_id"]

    @classmethod
    def of(cls, event: Shared) -> _InboxPush:
        return event.memo(("inbox",), cls, event)

    async def once(self, key: tuple[Any, ...], func: Callable[..., T], *args: Any) -> T:
        return await self.event.once(("inbox", *key), func, *args)

    def count_html(self, count: int) -> str:
        shown = {**pending_count_context(count), "oob": True}
        return self.event.memo(("inbox-count", count), render_to_string, "dashboard/_pending_count.html", shown)

    def prepared(self, frame: str, factory: Any) -> Any:
        """The websocket frame of `frame` (an autobahn PreparedMessage), built once for every socket."""
        return self.event.memo(("inbox-prepared", id(frame)), factory.prepareMessage, frame.encode())

    def frame(self, html: str, count: int) -> str:
        """The whole frame a socket sends: its variant's partial and the count, joined once."""
        return self.event.memo(("inbox-frame", id(html), count), lambda: html + self.count_html(count))


def _described_approval(approval_id: str) -> Approval | None:
    """The approval with what every reviewer's card shows (not whether they may decide it)."""
    try:
        approval = selectors.approval_get(approval_id)
    except services.NotFound:
        return None
    describe_cards([approval])
    eligibility.read_votes([approval])  # once, not again by each variant of the card
    return approval


def _card_html(approval: Approval, decidable: bool, replace: bool, insert_at: str) -> str:
    card = copy.copy(approval)  # each variant marks its own copy
    card.decidable = decidable  # type: ignore[attr-defined]  # display-only, as eligibility.mark sets it
    if replace:
        html = render_to_string("dashboard/_approval_card.html", {"approval": card, "oob": True})
    else:
        html = render_to_string("dashboard/_card_push.html", {"approval": card, "insert_at": insert_at})
    return text.repair(html)


def _decided_html(approval_id: str) -> str:
    """Say who decided in the card's status line, then remove it (app.js keeps a card being worked on)."""
    try:
        approval = selectors.approval_get(approval_id)
    except services.NotFound:
        return text.repair(render_to_string("dashboard/_card_gone.html", {"approval_id": approval_id}))
    return text.repair(render_to_string("dashboard/_card_decided.html", {"approval": approval}))


def _pending_counts(for_me: bool, agent: str, tool: str, search: str) -> tuple[int, list[Approval] | None]:
    """Count, up to INBOX_COUNT_CAP + 1, the pending approvals a filter lists: all of them, or (For me)
    those open to every reviewer plus the restricted ones, which each reviewer's own rights then sort
    out (None: more of them than the cap, which each reviewer counts in SQL instead)."""
    approvals = _pending(agent, tool, search)
    if not for_me:
        return selectors.count_up_to(approvals, INBOX_COUNT_CAP + 1), []
    open_to_all = selectors.count_up_to(approvals.filter(eligibility.OPEN_TO_ALL), INBOX_COUNT_CAP + 1)
    if open_to_all > INBOX_COUNT_CAP:
        return open_to_all, []  # "500+" whoever may decide the rest
    restricted = list(approvals.exclude(eligibility.OPEN_TO_ALL).select_related("run")[: INBOX_COUNT_CAP + 1])
    return open_to_all, restricted if len(restricted) <= INBOX_COUNT_CAP else None


def _decidable_count(user: Any, agent: str, tool: str, search: str) -> int:
    """Count, up to INBOX_COUNT_CAP + 1, the pending approvals this user may decide, as the page does."""
    return selectors.count_up_to(eligibility.decidable(user, _pending(agent, tool, search)), INBOX_COUNT_CAP + 1)


def _pending(agent: str, tool: str, search: str) -> QuerySet[Approval]:
    return selectors.approval_list(
        status=Approval.Status.PENDING, agent=agent or None, tool=tool or None, search=search, order=selectors.OLDEST
    )


class RunConsumer(_GroupConsumer):
    """Append each stored event of one run to its open timelines, and refresh its status."""

    def group_to_join(self) -> str | None:
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        if text.problem(self.run_id) is not None:  # no run has such an id (and PostgreSQL refuses NUL)
            return None
        try:
            selectors.run_get(self.run_id)
        except services.NotFound:
            return None
        return events.run_group(self.run_id)

    def run_event(self, message: dict[str, Any]) -> None:
        if message["seq"] is None:
            return  # streamed tokens: the timeline shows stored events only
        event = selectors.run_event_get(run_id=self.run_id, seq=message["seq"])
        if event is None:
            return
        run = selectors.run_get(self.run_id)
        self.push(render_to_string("dashboard/_event_push.html", {"event": event, "run": run}))


PRESENCE_TTL_SECONDS = 6 * 3600  # a crashed server leaves no viewer listed forever


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)


class ApprovalConsumer(_GroupConsumer):
    """Keep an open approval page current: its status, votes, and who else has it open.

    Who is viewing is a Redis hash per approval (socket → username), shared by every web
    process; each arrival or departure tells the approval's group to re-render the list.
    """

    def group_to_join(self) -> str | None:
        params = _query(self.scope)
        self.approval_id = params.get("id", "")
        if not self.approval_id or text.problem(self.approval_id) is not None:
            return None
        try:
            approval = selectors.approval_get(self.approval_id)
        except services.NotFound:
            return None
        digest = hashlib.sha256(self.approval_id.encode()).hexdigest()[:32]
        self.presence_group = f"approval-viewers.{digest}"
        self.presence_key = f"agentfast:viewers:{digest}"
        return events.run_group(approval.run_id)

    def connect(self) -> None:
        super().connect()
        if self.group and hasattr(self, "presence_group"):
            async_to_sync(self.channel_layer.group_add)(self.presence_group, self.channel_name)
            self.groups_joined.append(self.presence_group)
            _redis().hset(self.presence_key, self.channel_name, self.scope["user"].get_username())
            _redis().expire(self.presence_key, PRESENCE_TTL_SECONDS)
            self._announce()

    def disconnect(self, code: int) -> None:
        if self.group and hasattr(self, "presence_key"):
            _redis().hdel(self.presence_key, self.channel_name)
            self._announce()
        super().disconnect(code)

    def _announce(self) -> None:
        async_to_sync(self.channel_layer.group_send)(self.presence_group, {"type": "presence.changed"})

    def presence_changed(self, message: dict[str, Any]) -> None:
        self._push_live()

    def run_event(self, message: dict[str, Any]) -> None:
        data = message.get("data") or {}
        if data.get("approval_id") != self.approval_id:
            return
        if message["event"] in (RunEvent.Type.APPROVAL_VOTED, RunEvent.Type.APPROVAL_DECIDED):
            self._push_live()

    def _push_live(self) -> None:
        try:
            approval = selectors.approval_get(self.approval_id)
        except services.NotFound:
            return
        me = self.scope["user"].get_username()
        viewers = sorted({name for name in _redis().hvals(self.presence_key) if name != me})
        context = {"approval": approval, "viewers": viewers, "oob": True}
        self.push(
            render_to_string("dashboard/_approval_live.html", context)
            + render_to_string("dashboard/_approval_status.html", context)
        )
