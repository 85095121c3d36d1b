"""The quick filters give what the built-ins they stand in for give."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.template import Context, Template

MOMENTS = [
    datetime(2026, 12, 1, 22, 13, 38, 576929, tzinfo=UTC),
    datetime(2026, 1, 1, tzinfo=UTC),  # no microseconds
    datetime(2026, 6, 1, 8, 30, tzinfo=timezone(timedelta(hours=-5))),
    None,
]
TEXTS = ["", "short", "x" * 140, "x" * 141, "e\u0301" * 140, "e\u0301" * 141, "<b>&amp;</b> " * 20, "\U0001f600" * 150]


def _render(source: str, value: object) -> str:
    return Template("{% load agentfast %}" + source).render(Context({"value": value}))


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris"])
def test_it_writes_a_moment_as_date_c_does(settings: Any, moment: datetime | None, zone: str) -> None:
    settings.TIME_ZONE = zone
    assert _render("{{ value|iso_time }}", moment) == _render("{{ value|date:'c' }}", moment)


@pytest.mark.parametrize("moment", [*MOMENTS, datetime(999, 3, 4, 5, 6, 7, tzinfo=UTC)])
@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris"])
@pytest.mark.parametrize(("precision", "pattern"), [("", "Y-m-d H:i"), (":'seconds'", "Y-m-d H:i:s")])
def test_it_writes_a_moment_as_date_with_its_pattern_does(
    settings: Any, moment: datetime | None, zone: str, precision: str, pattern: str
) -> None:
    settings.TIME_ZONE = zone
    ours = _render(f"{{{{ value|datetime_text{precision} }}}}", moment)
    assert ours == _render(f"{{{{ value|date:'{pattern}' }}}}", moment)


@pytest.mark.parametrize("value", TEXTS)
def test_it_truncates_as_truncatechars_does_escaped(value: str) -> None:
    assert _render("{{ value|truncate:140 }}", value) == _render("{{ value|truncatechars:140 }}", value)
