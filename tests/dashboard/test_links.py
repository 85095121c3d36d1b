"""Links built from one `reverse` per route are the links `reverse` gives."""

from __future__ import annotations

import pytest
from django.urls import NoReverseMatch, reverse

from dashboard.web import links

VALUES = [
    "appr_run_01M8XEH1N5WTPVJ9QV03A2A8X1_call_1_1",
    "run_01M8XEH1N5WTPVJ9QV03A2A8X1",
    "x",
    "a b",
    "é<&>'\"",
    "%41",
]


@pytest.mark.parametrize("name", ["approval", "approval-decide", "run"])
@pytest.mark.parametrize("value", VALUES)
def test_it_links_as_reverse_does(name: str, value: str) -> None:
    assert links.route(name)(value) == reverse(name, args=[value])


def test_it_refuses_what_reverse_refuses() -> None:
    with pytest.raises(NoReverseMatch):
        links.route("run")("a/b")
