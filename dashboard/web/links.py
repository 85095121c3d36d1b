"""Links to many rows of a list, each what `reverse` gives, for the cost of one `reverse` per route.

A `{% url %}` per link cost an inbox page of twenty cards about a fifth of its rendering:
each `reverse` looks up the URLconf, the script prefix and the route again.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from django.urls import reverse

# Approval and run ids are made of these (agents.ids): put in a URL as they are, as `reverse` would.
_PLAIN = re.compile(r"[A-Za-z0-9_-]+")
_MARK = "__ROW_ID__"


def route(name: str) -> Callable[[str], str]:
    """Return a function giving `reverse(name, args=[value])` for a route of one argument, reversed once now.

    A value of other characters than an id's (which `reverse` quotes, or refuses) is reversed itself.
    """
    before, after = reverse(name, args=[_MARK]).split(_MARK)

    def link(value: str) -> str:
        return before + value + after if _PLAIN.fullmatch(value) else reverse(name, args=[value])

    return link
