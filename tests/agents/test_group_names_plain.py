"""Approver group names with control or invisible characters: refused, as every other name shown to people is."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from agents import services
from dashboard import cli


@pytest.mark.parametrize("group", ["ops\u200b", "fin\x1b[2Kance", "\u202eops"])
@pytest.mark.parametrize("command", ["create", "groups"])
def test_it_refuses_a_group_name_that_shows_as_another(db, capsys, alice, group: str, command: str) -> None:
    """`--group 'ops\\u200b'` made a group listed as "ops" that agentfast.yaml's ops never matches."""
    argv = (
        ["users", "create", "erin", "--role", "reviewer", "--password", "pw-9f8e7d6c5b", "--group", group]
        if command == "create"
        else ["users", "groups", "alice", group]
    )
    code = cli.main(argv)

    captured = capsys.readouterr()
    assert code == 1, captured.out
    assert captured.err.startswith("agentfast: ") and captured.err.count("\n") == 1
    assert not Group.objects.exclude(name__in=services.users.ROLES).exists()
