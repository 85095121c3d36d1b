"""What the dashboard's pages share: lists read a page at a time without counting, and refusals htmx shows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.views.decorators.cache import cache_control
from django.views.decorators.vary import vary_on_headers
from django_htmx.middleware import HtmxDetails

from agents import selectors


class HtmxHttpRequest(HttpRequest):
    """A request as django-htmx's middleware leaves it: `request.htmx` tells an htmx request apart."""

    htmx: HtmxDetails


# Deeper pages would make the database skip that many rows: the filters narrow a search instead.
MAX_PAGE = 2000


@dataclass
class Window:
    """One page of a list, found without counting the list: it reads one row past the page to know if more follow.

    A COUNT(*) over 100,000 runs or 1,000,000 audit entries costs more than the page itself, so the
    runs and audit pages say "Older →" when there is more rather than "page 3 of 40,000".
    """

    object_list: list[Any]
    number: int
    has_next: bool
    pages: int | None = None  # known when the list was counted (the inbox, up to INBOX_COUNT_CAP)
    paginator: None = None
    last_key: str = ""  # the id of the page's last row, where the next page starts (_pager.html's `after`)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.object_list)

    def __len__(self) -> int:
        return len(self.object_list)

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    def has_other_pages(self) -> bool:
        return self.has_next or self.has_previous

    def next_page_number(self) -> int:
        return self.number + 1

    def previous_page_number(self) -> int:
        return self.number - 1


Keyset = Callable[[QuerySet[Any], str], QuerySet[Any] | None]


def window(items: QuerySet[Any], request: HttpRequest, size: int, after: Keyset | None = None) -> Window:
    """Return the requested page of `items` (page 1 for a missing or bad number), reading size + 1 rows.

    With `after` (how the list goes on from a row), the pager's next link names the last row
    shown: that page starts right after it, so a row added meanwhile does not show twice, as
    counting `page` rows from the top would. A link naming no row: by the number.
    """
    number = page_number(request.GET.get("page", ""))
    following = after(items, request.GET.get("after", "")) if after is not None and number > 1 else None
    if following is not None:
        rows = _rows(following, 0, size + 1)
    else:
        rows = _rows(items, (number - 1) * size, number * size + 1)
    if not rows and number > 1:  # past the end (the list shrank, or a made-up number): the first page
        number, rows = 1, _rows(items, 0, size + 1)
    has_next = len(rows) > size
    last_key = str(rows[size - 1].pk) if has_next and after is not None else ""
    return Window(object_list=rows[:size], number=number, has_next=has_next, last_key=last_key)


def count_pages(page: Window, items: QuerySet[Any], *, size: int, cap: int) -> int:
    """Count `items` up to `cap` + 1, a bounded read rather than a COUNT(*) of them all; under the cap, set page.pages.

    A first page with nothing after it holds the whole list: its rows are the count. A search
    matching a few calls, or none, is then read once rather than twice (each a scan of every
    row the search cannot rule out).
    """
    whole = page.number == 1 and not page.has_next
    count = len(page.object_list) if whole else selectors.count_up_to(items, cap + 1)
    if count <= cap:
        page.pages = max(1, -(-count // size))
    return count


def count_context(count: int, cap: int) -> dict[str, Any]:
    """What a heading shows of a count read up to `cap` + 1: the number, or the cap and a "+"."""
    return {"count": min(count, cap), "count_more": count > cap}


def page_number(raw: str) -> int:
    """Return the page a `page` parameter names, up to MAX_PAGE; 1 for anything else.

    ASCII digits only: str.isdigit() admits "²" and "①", which int() refuses; and int() refuses
    over 4,300 digits, so a number longer than MAX_PAGE's is read as MAX_PAGE without it.
    """
    digits = raw.lstrip("0")
    if not (raw.isascii() and raw.isdigit()) or not digits:
        return 1
    return MAX_PAGE if len(digits) > len(str(MAX_PAGE)) else min(int(digits), MAX_PAGE)


def _rows(items: QuerySet[Any], start: int, stop: int) -> list[Any]:
    """Return items[start:stop]; past the first rows of a joined list, by their keys first, then in full.

    The rows skipped on the way to a later page of the inbox are then read for their keys only,
    not joined to the run and tool call each card shows, to be thrown away. A list without
    select_related (runs, audit) gains nothing from the second round trip.
    """
    if start == 0 or not items.query.select_related:
        return list(items[start:stop])
    keys = list(items.values_list("pk", flat=True)[start:stop])
    found = {row.pk: row for row in items.filter(pk__in=keys)}
    return [found[key] for key in keys if key in found]  # one decided in between is gone from the page


def live_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Mark a page whose live list re-fetches itself (htmx) from the page's own URL.

    The fragment and the page share a URL: without `Vary` the browser's cache may hand the
    fragment to Back, and without `no-store` either may be replayed from the cache.
    """
    return vary_on_headers("HX-Request")(cache_control(no_store=True)(view))


def query_without_page(params: QueryDict) -> str:
    """Return these filters as a query string, for pagination links (and what a saved filter keeps)."""
    return urlencode([(key, value) for key, value in params.items() if key not in ("page", "after") and value])


# htmx swaps no 403 (a refused page, a failed CSRF check would land in a card): a partial that says
# why a decision was not permitted carries this header, and app.js swaps it like a 409.
REFUSAL_HEADER = "X-Agentfast-Refusal"


def refusal_shown(response: HttpResponse) -> HttpResponse:
    """Mark a partial answering 403 (not an approver, four eyes, a grant refused) as the refusal to show."""
    if response.status_code == 403:
        response[REFUSAL_HEADER] = "not-permitted"
    return response


def errors_text(form: forms.Form) -> str:
    return "; ".join(f"{field}: {' '.join(str(e) for e in errors)}" for field, errors in form.errors.items())
