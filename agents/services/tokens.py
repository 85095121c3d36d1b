"""Bearer tokens for the HTTP API: `af_<prefix>_<secret>`, stored as a sha256 hash."""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from datetime import timedelta
from typing import cast

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from agents import events, sql
from agents.models import ApiToken
from agents.services.errors import InvalidInput, NotFound
from agents.services.users import username_as_typed

LAST_USED_RESOLUTION = timedelta(minutes=1)
_NAME_CHARS = cast(int, ApiToken._meta.get_field("name").max_length)
_PREFIX_DRAWS = 3


def _hash(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


def token_create(*, username: str, name: str = "") -> tuple[ApiToken, str]:
    """Create a token for a user; return it and the secret, which is never shown again."""
    # Checked here, not left to the database: SQLite stores any length, PostgreSQL raises.
    if len(name) > _NAME_CHARS:
        raise InvalidInput(f"a token's name is at most {_NAME_CHARS} characters, not {len(name)}", field="name")
    user = User.objects.filter(username=username_as_typed(username), is_active=True).first()  # as names are stored
    if user is None:
        raise InvalidInput(f"no active user {username!r} (create one with `agentfast users create`)", field="user")
    # The prefix (32 bits, unique) is drawn again when taken: about one draw in 4,300 at 1,000,000 tokens.
    for _ in range(_PREFIX_DRAWS - 1):
        with contextlib.suppress(IntegrityError), transaction.atomic():  # a savepoint, rolled back if taken
            return _token_row(user, name)
    return _token_row(user, name)


def _token_row(user: User, name: str) -> tuple[ApiToken, str]:
    prefix = secrets.token_hex(4)
    token = f"af_{prefix}_{secrets.token_urlsafe(32)}"
    return ApiToken.objects.create(user=user, name=name, prefix=prefix, token_hash=_hash(token)), token


def token_revoke(*, prefix: str) -> ApiToken:
    """Revoke a token by its prefix; revoking twice is harmless."""
    prefix = prefix.removeprefix("af_").split("_")[0]
    token = ApiToken.objects.filter(prefix=prefix).first()
    if token is None:
        raise NotFound(f"no token {prefix}")
    with transaction.atomic():
        if ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()):
            events.access_changed(group=events.token_group(token.pk))  # its open streams end
    token.refresh_from_db()
    return token


def token_find(token: str) -> ApiToken | None:
    """Return the live token with this secret, or None (without recording a use)."""
    return ApiToken.objects.filter(token_hash=_hash(token), revoked_at__isnull=True).first()


def token_authenticate(token: str) -> User | None:
    """Return the active user a live token belongs to, with their permissions read; or None. Records its use."""
    now = timezone.now()
    found = sql.token_user(token_hash=_hash(token), used_before=now - LAST_USED_RESOLUTION)
    if found is None:
        return None
    user, token_pk, stale = found
    if not user.is_active:
        return None
    # To the minute is enough to see which tokens are in use; a write per request is not.
    if stale:
        ApiToken.objects.filter(pk=token_pk).update(last_used_at=now)
    return user
