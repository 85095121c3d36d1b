"""The API lists' pages: newest first, by `offset` or by a signed keyset `cursor`.

An offset makes the database walk past every skipped row, so page 2,000 of 100,000 pending
approvals costs 2,000 times page 1; and a row decided or added in between shifts every later
page by one. A cursor names the last row a page showed (its `created_at` and id): the next
page starts right after it, read off the same index as the first, and rows added since
(newer, so before it) move nothing. Cursors are signed: a client passes back what it got.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.core import signing
from django.db.models import QuerySet
from django.http import HttpRequest
from ninja import Field, Schema
from ninja.pagination import LimitOffsetPagination, paginate

from agents import schemas, selectors
from dashboard.api.auth import ApiError

_View = TypeVar("_View", bound=Callable[..., Any])

MAX_PAGE = 200
MAX_OFFSET = 1_000_000_000
COUNT_CAP = 500  # the lists count their rows this far past the offset, no further
# A cursor holds a row's time and id (ids are at most 200 characters): twice that is ample.
MAX_CURSOR = 1000
_CURSOR_TEXT = re.compile(r"[A-Za-z0-9_:-]+")  # what Signer.sign_object writes: URL-safe base64, ":", more
_SIGNER = signing.Signer(salt="agentfast.api.cursor")


class PageQuery(LimitOffsetPagination.Input):
    limit: int = Field(50, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    cursor: str | None = Field(
        None,
        max_length=MAX_CURSOR,
        description="The `next_cursor` of the page before: this page starts right after its last row "
        "(instead of `offset`; rows added since do not shift it)",
    )


class BadCursor(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(f"cursor: {message}", code="invalid_cursor", field="cursor")


def cursor_for(list_name: str, row: Any) -> str:
    """Return the signed cursor of a list's position just after `row`."""
    return _SIGNER.sign_object([list_name, row.created_at.isoformat(), row.pk])


def position_of(list_name: str, cursor: str) -> tuple[datetime, str]:
    """Return the (created_at, id) a cursor of this list names; BadCursor for anything this API did not sign."""
    if not _CURSOR_TEXT.fullmatch(cursor):
        raise BadCursor("not a cursor this API returned (start again without one)")
    try:
        name, moment, pk = _SIGNER.unsign_object(cursor)
        created_at = datetime.fromisoformat(moment)
    except (signing.BadSignature, ValueError, TypeError):  # tampered, truncated, or signed with another key
        raise BadCursor("not a cursor this API returned (start again without one)") from None
    if name != list_name or not isinstance(pk, str) or created_at.tzinfo is None:
        raise BadCursor(f"a cursor of another list, not of {list_name}")
    return created_at, pk


class Page(LimitOffsetPagination):
    """The page shape, `{"count", "count_capped", "has_more", "limit", "offset", "next_cursor", "items"}`.

    The rows are newest first (created_at, then id, both descending: the keyset) and each is
    given as `shape`. They are counted no further than COUNT_CAP past the page's start (as the
    inbox says "500+"): an exact COUNT(*) of 100,000 pending approvals, filtered through a
    join, cost more than the page itself, on every call.
    """

    Input = PageQuery  # type: ignore[assignment]  # a subclass of the base's Input, which mypy takes as fixed

    class Output(Schema):
        count: int = Field(
            description=f"How many match, on all pages, counted up to {COUNT_CAP} past `offset` "
            "(with `cursor`: from this page's first row on): when `count_capped`, at least this many"
        )
        count_capped: bool = Field(description="`count` stopped at its cap: more match than it says")
        has_more: bool = Field(
            description="Rows follow this page: ask again with `cursor` = `next_cursor` (or `offset` + `limit`)"
        )
        limit: int
        offset: int
        next_cursor: str | None = Field(description="The `cursor` of the page after this one; null on the last page")
        items: list[Any]

    def __init__(
        self,
        *,
        shape: type[schemas.ApprovalSummary | schemas.RunSummary],
        list_name: str,
        filters: tuple[str, ...],
        **kwargs: Any,
    ) -> None:
        super().__init__(max_limit=MAX_PAGE, **kwargs)
        self.shape, self.list_name = shape, list_name
        self.takes = (*filters, *PageQuery.model_fields)

    def _refuse_unknown(self, request: HttpRequest) -> None:
        """Refuse a query parameter the list does not take: a misspelt or foreign filter would list every row, unsaid."""
        unknown = next((key for key in request.GET if key not in self.takes), None)
        if unknown is not None:
            name = unknown[:100]
            raise ApiError(f"{name}: not a parameter of this list (it takes {', '.join(self.takes)})", field=name)

    def paginate_queryset(
        self, queryset: QuerySet[Any], pagination: LimitOffsetPagination.Input, request: HttpRequest, **params: Any
    ) -> dict[str, Any]:
        """Return one page of the rows, each as its shape, how many there are up to the cap, and the next cursor."""
        assert isinstance(pagination, PageQuery)  # Input above
        self._refuse_unknown(request)
        offset, limit = pagination.offset, pagination.limit
        rows = queryset.order_by("-created_at", "-pk")
        if pagination.cursor:  # empty: a form left blank, the first page
            if offset:
                raise ApiError("offset: give a cursor or an offset, not both", field="offset")
            created_at, pk = position_of(self.list_name, pagination.cursor)
            rows = selectors.newest_first_after(rows, created_at=created_at, pk=pk)
        reach = offset + max(limit, COUNT_CAP)  # past the page, so has_more is exact
        counted = selectors.count_up_to(rows, reach + 1)
        page = list(rows[offset : offset + limit]) if counted > offset else []
        has_more = counted > offset + limit
        return {
            "count": min(counted, reach),
            "count_capped": counted > reach,
            "has_more": has_more,
            "limit": limit,
            "offset": offset,
            "next_cursor": cursor_for(self.list_name, page[-1]) if has_more and page else None,
            "items": [self.shape.of(row) for row in page],
        }


def paged(shape: type[schemas.ApprovalSummary | schemas.RunSummary], list_name: str) -> Callable[[_View], _View]:
    """Paginate a view's rows with Page, as `shape`; `list_name` keeps one list's cursors out of another."""

    def decorate(view: _View) -> _View:
        # Ninja reads the annotations through its wrapper, whose globals are not ours: resolve them here.
        view.__annotations__ = typing.get_type_hints(view, include_extras=True)
        filters = tuple(name for name in inspect.signature(view).parameters if name != "request")
        wrapped: _View = paginate(Page, shape=shape, list_name=list_name, filters=filters)(view)
        return wrapped

    return decorate
