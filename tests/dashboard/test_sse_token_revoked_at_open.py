"""A token revoked between the API's authentication and the stream's set-up must not leave a stream nothing ends."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.test import RequestFactory

from agents import services
from dashboard.api.auth import ApiError
from dashboard.live import sse


@pytest.mark.django_db(transaction=True)
async def test_a_stream_opened_with_a_token_revoked_after_authentication_is_refused_or_ends():
    await sync_to_async(services.user_create)(username="alice", role="reviewer", password="alice-password")
    token_row, token = await sync_to_async(services.token_create)(username="alice")
    request = RequestFactory().get("/api/events", HTTP_AUTHORIZATION=f"Bearer {token}")
    request.auth = await sync_to_async(services.token_authenticate)(token)  # ninja authenticated it
    assert request.auth is not None
    await sync_to_async(services.token_revoke)(prefix=token_row.prefix)  # revoked at this very moment

    try:
        viewer = await sse.viewer_of(request)
    except ApiError:
        return  # refused: fine
    # Otherwise the stream must be one that knows its token, so its re-checks end it.
    assert not await sync_to_async(sse._may_still_watch)(viewer)
