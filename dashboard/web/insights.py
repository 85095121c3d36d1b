"""The Insights page: how the team decides, drawn as server-side SVG (no script, no CDN).

The database counts and groups (a 30-day window of a busy team holds 100,000 decisions); the
figures are pure functions of what it returns (`summarize`, `queue_depth`), so they are
tested on known tallies, and the selectors on known rows.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views.decorators.http import require_GET

from agents import selectors
from agents.models import Approval
from dashboard.auth import reviewer_required

RUBBER_STAMP_SECONDS = 2.0  # approved faster than a person can read the call
RULE_SUGGESTION_MIN = 10  # this many approvals, none edited nor rejected, suggest a rule
WINDOWS = (7, 30, 90)
DEPTH_POINTS = 48


@dataclass(frozen=True)
class Tally:
    """How many decisions in the window share a tool, an agent, a decider and an outcome."""

    tool: str
    agent: str
    reviewer: str  # "" for an automatic decision (a rule, a grant, a deadline)
    outcome: str  # approved, edited or rejected
    count: int
    quick: int = 0  # of them, decided within RUBBER_STAMP_SECONDS of being asked


@dataclass
class Rates:
    approved: int = 0
    edited: int = 0
    rejected: int = 0

    @property
    def total(self) -> int:
        return self.approved + self.edited + self.rejected


@dataclass
class Summary:
    decisions: int = 0
    latency_by_tool: dict[str, tuple[float, float]] = field(default_factory=dict)  # p50, p95
    latency_series: dict[str, list[tuple[date, float, float]]] = field(default_factory=dict)
    by_tool: dict[str, Rates] = field(default_factory=dict)
    by_agent: dict[str, Rates] = field(default_factory=dict)
    by_reviewer: dict[str, Rates] = field(default_factory=dict)
    rubber_stamped: dict[str, int] = field(default_factory=dict)  # reviewer -> approvals under 2 s
    suggestions: list[tuple[str, int]] = field(default_factory=list)  # tool, approvals (all approved as asked)


def read_tallies(since: datetime) -> list[Tally]:
    """Return the window's decisions as tallies; an approval with edited arguments is an edit."""
    return [
        Tally(tool, agent, person, "edited" if status == Approval.Status.APPROVED and edited else status, count, quick)
        for tool, agent, person, status, edited, count, quick in selectors.decision_tallies(
            since=since, quick_seconds=RUBBER_STAMP_SECONDS
        )
    ]


def summarize(tallies: Iterable[Tally], latencies: Iterable[selectors.WaitPercentiles]) -> Summary:
    """Compute every figure of the page from the window's tallies and how long its people took to decide."""
    tallies = list(tallies)
    people = [tally for tally in tallies if tally.reviewer]  # automatic decisions take no time and stamp nothing
    summary = Summary(decisions=sum(tally.count for tally in tallies))
    summary.by_tool = _rates(tallies, lambda tally: tally.tool)
    summary.by_agent = _rates(tallies, lambda tally: tally.agent)
    summary.by_reviewer = _rates(people, lambda tally: tally.reviewer)
    # The whole window's row (day None) sorts first among its tool's.
    for tool, day, p50, p95 in sorted(latencies, key=lambda row: (row[0], row[1] is not None, row[1])):
        if day is None:
            summary.latency_by_tool[tool] = (p50, p95)
            summary.latency_series[tool] = []
        else:
            summary.latency_series[tool].append((day, p50, p95))
    stamped: Counter[str] = Counter()
    for tally in people:
        if tally.outcome == "approved" and tally.quick:
            stamped[tally.reviewer] += tally.quick
    summary.rubber_stamped = dict(sorted(stamped.items(), key=lambda item: (-item[1], item[0])))
    summary.suggestions = [
        (tool, rates.approved)
        for tool, rates in summary.by_tool.items()
        if rates.approved >= RULE_SUGGESTION_MIN and rates.approved == rates.total
    ]
    return summary


def _rates(tallies: Iterable[Tally], key: Callable[[Tally], str]) -> dict[str, Rates]:
    rates: dict[str, Rates] = defaultdict(Rates)
    for tally in tallies:
        bucket = rates[key(tally)]
        setattr(bucket, tally.outcome, getattr(bucket, tally.outcome) + tally.count)
    return dict(sorted(rates.items(), key=lambda item: (-item[1].total, item[0])))


def queue_depth(
    periods: Mapping[int, tuple[int, int]], *, start: datetime, end: datetime
) -> list[tuple[datetime, int]]:
    """Return the most approvals open at once in each of DEPTH_POINTS equal periods from `start` to `end`.

    The peak, not a sample: a call decided in seconds still shows in its period. `periods`
    is selectors.approvals_open_by_period's answer: a period with no row peaks at the number
    open when it began, the net changes of the periods before it added up.
    """
    step = (end - start) / DEPTH_POINTS
    open_now = periods.get(-1, (0, 0))[1]
    points = []
    for period in range(DEPTH_POINTS):
        peak, change = periods.get(period, (open_now, 0))
        points.append((start + step * period, max(peak, open_now)))
        open_now += change
    return points


# -- drawing -----------------------------------------------------------------------------

WIDTH, HEIGHT, PAD = 560, 200, 36


def seconds_text(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _n(value: float) -> str:
    """Return a coordinate with one decimal (format_html escapes its arguments to text first)."""
    return f"{value:.1f}"


def _polyline(points: Sequence[tuple[float, float]], css: str) -> SafeString:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return format_html('<polyline class="{}" points="{}"/>', css, coords)


def _frame(title: str, body: SafeString, *, labels: SafeString | None = None) -> SafeString:
    return format_html(
        '<svg class="chart" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        '<line class="axis" x1="{}" y1="{}" x2="{}" y2="{}"/><line class="axis" x1="{}" y1="{}" x2="{}" y2="{}"/>'
        "{}{}</svg>",
        WIDTH,
        HEIGHT,
        title,
        PAD,
        PAD / 2,
        PAD,
        HEIGHT - PAD,
        PAD,
        HEIGHT - PAD,
        WIDTH - 8,
        HEIGHT - PAD,
        body,
        labels or "",
    )


def latency_chart(tool: str, series: Sequence[tuple[date, float, float]]) -> SafeString:
    """Draw p50 and p95 seconds-to-decision per day as two lines."""
    top = max((p95 for _, _, p95 in series), default=1.0) or 1.0
    x = _spread(len(series))

    def y(value: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 1.5 * PAD) * value / top

    p50 = [(x(index), y(value)) for index, (_, value, _) in enumerate(series)]
    p95 = [(x(index), y(value)) for index, (_, _, value) in enumerate(series)]
    dots = format_html_join("", '<circle cx="{}" cy="{}" r="3" class="p50"/>', ((_n(px), _n(py)) for px, py in p50))
    labels = format_html(
        '<text x="4" y="{}">{}</text><text x="4" y="{}">0</text>{}',
        PAD / 2 + 4,
        seconds_text(top),
        HEIGHT - PAD,
        _day_labels([day for day, _, _ in series], x),
    )
    title = f"{tool}: seconds to decision, p50 and p95 per day"
    return _frame(title, format_html("{}{}{}", _polyline(p95, "p95"), _polyline(p50, "p50"), dots), labels=labels)


def _spread(count: int) -> Callable[[int], float]:
    usable = WIDTH - PAD - 24

    def x(index: int) -> float:
        return PAD + 12 + (usable * index / (count - 1) if count > 1 else usable / 2)

    return x


def _day_labels(days: Sequence[date], x: Callable[[int], float]) -> SafeString:
    every = max(len(days) // 6, 1)
    picked = [
        (x(index), HEIGHT - PAD + 16, day.strftime("%b %d")) for index, day in enumerate(days) if index % every == 0
    ]
    return format_html_join(
        "", '<text x="{}" y="{}" text-anchor="middle">{}</text>', ((_n(px), py, day) for px, py, day in picked)
    )


def depth_chart(points: Sequence[tuple[datetime, int]]) -> SafeString:
    """Draw the number of open approvals over time as an area."""
    top = max((depth for _, depth in points), default=0) or 1
    x = _spread(len(points))
    line = [(x(index), HEIGHT - PAD - (HEIGHT - 1.5 * PAD) * depth / top) for index, (_, depth) in enumerate(points)]
    area = [(line[0][0], HEIGHT - PAD), *line, (line[-1][0], HEIGHT - PAD)] if line else []
    coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in area)
    labels = format_html('<text x="4" y="{}">{}</text><text x="4" y="{}">0</text>', PAD / 2 + 4, top, HEIGHT - PAD)
    return _frame(
        "open approvals over time", format_html('<polygon class="depth" points="{}"/>', coords), labels=labels
    )


def rates_chart(title: str, rates: dict[str, Rates]) -> SafeString:
    """Draw one stacked bar per name: approved, edited, rejected, each labelled with its count."""
    row_height, label_width, bar_width = 26, 150, WIDTH - 150 - 60
    bars = []
    for index, (name, rate) in enumerate(rates.items()):
        top, left = 8 + index * row_height, label_width
        # A nested <svg> clips a long name (an MCP tool's) at its bar; the tooltip and the table give it whole.
        bars.append(
            format_html(
                '<svg x="0" y="{}" width="{}" height="{}"><text x="4" y="14" class="bar-name">{}<title>{}</title></text></svg>',
                top,
                label_width - 6,
                row_height,
                name,
                name,
            )
        )
        for part in ("approved", "edited", "rejected"):
            count = getattr(rate, part)
            width = bar_width * count / rate.total if rate.total else 0
            if count:
                bars.append(
                    format_html(
                        '<rect class="{}" x="{}" y="{}" width="{}" height="18" data-count="{}">'
                        "<title>{}: {} {}</title></rect>",
                        part,
                        _n(left),
                        top,
                        _n(width),
                        count,
                        name,
                        count,
                        part,
                    )
                )
            left += width
        bars.append(format_html('<text x="{}" y="{}">{}</text>', WIDTH - 52, top + 14, rate.total))
    height = 16 + row_height * len(rates)
    return format_html(
        '<svg class="chart" viewBox="0 0 {} {}" role="img" aria-label="{}">{}</svg>',
        WIDTH,
        height,
        title,
        SafeString("".join(bars)),
    )


# -- the page ----------------------------------------------------------------------------


def _window(request: HttpRequest) -> int:
    try:
        days = int(request.GET.get("days", "30"))
    except ValueError:
        return 30
    return days if days in WINDOWS else 30


@require_GET
@reviewer_required
def insights_page(request: HttpRequest) -> HttpResponse:
    """Show how the team decides over the chosen window (7, 30 or 90 days)."""
    days = _window(request)
    now = timezone.now()
    since = now - timedelta(days=days)
    summary = summarize(read_tallies(since), selectors.decision_wait_percentiles(since=since))
    periods = selectors.approvals_open_by_period(start=since, seconds=(now - since).total_seconds() / DEPTH_POINTS)
    depth = queue_depth(periods, start=since, end=now)
    context = {
        "days": days,
        "windows": WINDOWS,
        "summary": summary,
        "latency": [
            (tool, *map(seconds_text, summary.latency_by_tool[tool]), latency_chart(tool, series))
            for tool, series in summary.latency_series.items()
        ],
        "depth_chart": depth_chart(depth),
        "depth_now": selectors.pending_approval_count(),
        # Pairs, not dicts: a template reads `mapping.items` as the key "items" first, and a
        # reviewer, agent or tool may be named "items", "keys" or "values".
        "rubber_stamped": list(summary.rubber_stamped.items()),
        "rates": [
            (title, rates_chart(title, rates), list(rates.items()))
            for title, rates in (
                ("By tool", summary.by_tool),
                ("By agent", summary.by_agent),
                ("By reviewer", summary.by_reviewer),
            )
            if rates
        ],
        "stamp_seconds": RUBBER_STAMP_SECONDS,
        "rule_min": RULE_SUGGESTION_MIN,
    }
    return render(request, "dashboard/insights.html", context)
