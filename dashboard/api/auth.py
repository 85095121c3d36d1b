"""Who calls the JSON API: a bearer token, or the browser's session with its CSRF token.

Only reviewers and admins see or decide anything: an anonymous caller gets 401, a
signed-in user who is neither gets 403, on every endpoint and on the SSE streams. The one
exception is the agent role's own: the gate (dashboard.api.gateway) and the event stream of
its own external sessions' runs.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.http import HttpRequest, JsonResponse
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from agents import services
from dashboard.auth import UNKNOWN_TOKEN, is_reviewer

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class ApiError(Exception):
    """An answer the API gives as `{"error_code", "message", ...}` with an HTTP status."""

    status = 400
    code = "invalid"

    def __init__(self, message: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.code
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error_code": self.code, "message": self.message, **self.extra}


class Unauthenticated(ApiError):
    status = 401
    code = "unauthenticated"


class Forbidden(ApiError):
    status = 403
    code = "forbidden"


def error_response(error: ApiError) -> JsonResponse:
    response = JsonResponse(error.body(), status=error.status)
    if error.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="agentfast"'
    return response


def admit(user: AbstractBaseUser | AnonymousUser, *, reviewers_only: bool) -> AbstractBaseUser:
    """Return the user if they may use the API, else raise Forbidden."""
    if reviewers_only and not is_reviewer(user):
        raise Forbidden("only reviewers and admins may use the API")
    return user  # type: ignore[return-value]


class TokenAuth(HttpBearer):
    """`Authorization: Bearer af_…` (from `agentfast tokens create USER`)."""

    def __init__(self, *, reviewers_only: bool = True) -> None:
        super().__init__()
        self.reviewers_only = reviewers_only

    def authenticate(self, request: HttpRequest, token: str) -> AbstractBaseUser:
        user = services.token_authenticate(token)
        if user is None:
            # A wrong token must not fall through to the session: say so.
            raise Unauthenticated(UNKNOWN_TOKEN)
        request.user = user  # the rest of the request (audit, permissions) acts as this user
        return admit(user, reviewers_only=self.reviewers_only)


class SessionAuth(APIKeyCookie):
    """The browser's Django session; unsafe methods must carry the X-CSRFToken header."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self, *, reviewers_only: bool = True) -> None:
        # CSRF is checked below, once we know there is a session: an anonymous POST is a
        # 401, not a CSRF failure.
        super().__init__(csrf=False)
        self.reviewers_only = reviewers_only

    def __call__(self, request: HttpRequest) -> AbstractBaseUser | None:
        if not request.user.is_authenticated:
            return None
        if request.method not in SAFE_METHODS and check_csrf(request) is not None:
            raise Forbidden("CSRF check failed: send the csrftoken cookie's value in X-CSRFToken", code="csrf_failed")
        return admit(request.user, reviewers_only=self.reviewers_only)

    def authenticate(self, request: HttpRequest, key: str | None) -> AbstractBaseUser | None:
        raise NotImplementedError  # __call__ does the work; APIKeyCookie requires the method


def reviewers() -> list[TokenAuth | SessionAuth]:
    """The API's default: a token or a session of a reviewer or admin."""
    return [TokenAuth(), SessionAuth()]


def signed_in() -> list[TokenAuth | SessionAuth]:
    """Any token or session; the view itself refuses non-reviewers (to audit the attempt)."""
    return [TokenAuth(reviewers_only=False), SessionAuth(reviewers_only=False)]
