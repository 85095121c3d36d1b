"""Hunt (the record): `audit verify` names an entry whose stored time was overwritten with text, as altered.

SQLite keeps a time as text: someone with write access to the file can put anything there. The
chain notices (the entry's hash no longer matches), but the report must name the entry, not crash.
PostgreSQL's timestamptz column cannot hold such a value: nothing to test there.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from tests.agents.test_audit_chain import history, raw, verify  # noqa: F401


@pytest.fixture
def overwritten(history):  # noqa: ANN001, ANN201, F811
    if connection.vendor != "sqlite":
        pytest.skip("only SQLite stores a time as text anyone can overwrite")
    raw("UPDATE {table} SET created_at = %s WHERE id = %s", ["not a time", history[3].pk])
    return history[3]


def test_verify_names_an_entry_whose_time_is_unreadable(overwritten, capsys):
    code, out = verify(capsys)

    assert code == 1
    assert out.startswith(f"broken after 3 intact entries: entry #{overwritten.pk} ")
    assert "altered" in out


def test_verify_names_it_in_json_too(overwritten, capsys):
    code, out = verify(capsys, "--json")

    report = json.loads(out)
    assert code == 1
    assert (report["ok"], report["problem"], report["entry"]["id"]) == (False, "altered", overwritten.pk)
