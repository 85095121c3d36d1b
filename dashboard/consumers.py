"""Live pushes to reviewers' browsers: inbox cards and run timelines, as htmx partials.

The engine sends `{"type": "run.event", ...}` to the Channels groups after commit
(agents.events); these consumers turn each event into the same partial a page load
renders, marked for an out-of-band swap that htmx's ws extension applies.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import import_module
from typing import Any

import redis
from asgiref.sync import async_to_sync
from channels.generic.websocket import WebsocketConsumer
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.http import QueryDict
from django.template.loader import render_to_string

from agents import events, selectors, services, text
from agents.models import Approval, RunEvent
from dashboard.auth import is_reviewer
from dashboard.forms import InboxFilter
from dashboard.views import prepare_cards

FORBIDDEN = 4403  # the websocket close code that says "not for you" (HTTP 403)
NOT_FOUND = 4404


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
        """Send a partial; text that cannot be UTF-8 (a lone surrogate) is repaired, never fatal."""
        self.send(text_data=text.repair(html))


def _may_still_watch(user_id: int, session_key: str | None) -> bool:
    user = selectors.user_get_active(user_id)
    if user is None or not is_reviewer(user):
        return False
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return str(session.get(SESSION_KEY)) == str(user_id)


class UnknownPathConsumer(WebsocketConsumer):
    """Refuse a websocket to a path no route serves (4404), as a page would answer 404."""

    def connect(self) -> None:
        self.close(code=NOT_FOUND)


class InboxConsumer(_GroupConsumer):
    """Push new approvals as cards and remove decided ones, in every open inbox."""

    def group_to_join(self) -> str:
        params = QueryDict(self.scope["query_string"].decode())
        # "For me" is this connection's user's: each socket renders its own cards.
        self.filters = InboxFilter(params, user=self.scope["user"])
        # Newest first: a new card slides in at the top of the first page. Oldest first: at the
        # bottom of the last page. Other pages would show it out of order.
        first_page = params.get("page", "1") in ("", "1")
        last_page = params.get("last", "1" if first_page else "0") == "1"
        self.insert_at = "afterbegin" if self.filters.ordering == selectors.NEWEST else "beforeend"
        self.inserts = first_page if self.insert_at == "afterbegin" else last_page
        return events.APPROVALS_GROUP

    def run_event(self, message: dict[str, Any]) -> None:
        if message["event"] == RunEvent.Type.APPROVAL_REQUIRED:
            html = self._card(message["data"]["approval_id"])
        elif message["event"] == RunEvent.Type.APPROVAL_VOTED:
            html = self._card(message["data"]["approval_id"], replace=True)
        elif message["event"] == RunEvent.Type.APPROVAL_DECIDED:
            html = self._decided(message["data"]["approval_id"])
        else:
            return
        if html is not None:
            count = self.filters.pending_approvals().count()
            self.push(html + render_to_string("dashboard/_pending_count.html", {"count": count, "oob": True}))

    def _decided(self, approval_id: str) -> str:
        """Say who decided in the card's status line, then remove it (app.js keeps a card being worked on)."""
        try:
            approval = selectors.approval_get(approval_id)
        except services.NotFound:
            return render_to_string("dashboard/_card_gone.html", {"approval_id": approval_id})
        return render_to_string("dashboard/_card_decided.html", {"approval": approval})

    def _card(self, approval_id: str, *, replace: bool = False) -> str | None:
        """Render a new card to insert, or (a vote) the card to swap in where it is shown."""
        try:
            approval = selectors.approval_get(approval_id)
        except services.NotFound:
            return None
        # Decided already (a fast reviewer) or filtered out: nothing to add.
        if approval.status != Approval.Status.PENDING or not self.filters.matches(approval):
            return None
        prepare_cards(self.scope["user"], [approval])
        if replace:  # htmx swaps it only where this card is on the page
            return render_to_string("dashboard/_approval_card.html", {"approval": approval, "oob": True})
        if not self.inserts:
            return None
        return render_to_string("dashboard/_card_push.html", {"approval": approval, "insert_at": self.insert_at})


class RunConsumer(_GroupConsumer):
    """Append each stored event of one run to its open timelines, and refresh its status."""

    def group_to_join(self) -> str | None:
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
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
        params = QueryDict(self.scope["query_string"].decode())
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
