"""Timeline entries are rendered once per process: the kept HTML is exactly the template's, for that event only."""

from __future__ import annotations

from django.template.loader import render_to_string
from django.utils import timezone

from agents.models import RunEvent
from dashboard.templatetags import agentfast
from tests.dashboard.conftest import REFUND
from tests.support.flows import start


def _event(pk: int, run_id: str, content: str, *, data: dict | None = None) -> RunEvent:
    data = data if data is not None else {"role": "user", "content": content}
    return RunEvent(pk=pk, run_id=run_id, seq=1, type="message", data=data, created_at=timezone.now())


def test_a_kept_entry_is_what_the_template_renders(client_for, alice):
    run = start(REFUND)
    events = list(RunEvent.objects.filter(run=run).order_by("seq"))

    client = client_for(alice)
    first = client.get(f"/runs/{run.id}").content.decode()
    again = client.get(f"/runs/{run.id}").content.decode()

    for event in events:
        fresh = render_to_string("dashboard/_event.html", {"event": event})
        assert fresh in first and fresh in again


def test_an_id_reused_by_another_event_finds_no_entry():
    first = agentfast.timeline_entry(_event(990_001, "run_a", "first words"))
    other = agentfast.timeline_entry(_event(990_001, "run_b", "other words"))

    assert "first words" in first and "other words" in other and "first words" not in other


def test_it_escapes_what_it_keeps():
    html = agentfast.timeline_entry(_event(990_002, "run_c", "<script>alert(1)</script>"))
    kept = agentfast.timeline_entry(_event(990_002, "run_c", "<script>alert(1)</script>"))

    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<script>" not in kept


def test_it_keeps_no_huge_entry():
    event = _event(990_003, "run_d", "x" * 100_000)

    html = agentfast.timeline_entry(event)

    assert "x" * 100_000 in html
    assert (event.pk, event.run_id, event.seq, event.created_at) not in agentfast._entries


def test_an_unsaved_event_is_rendered_and_not_kept():
    event = RunEvent(run_id="run_e", seq=1, type="message", data={"content": "draft"}, created_at=timezone.now())
    before = agentfast._entries.currsize

    assert "draft" in agentfast.timeline_entry(event)
    assert agentfast._entries.currsize == before
