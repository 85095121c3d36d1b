"""The `agentfast` CLI given odd option values: a clear refusal, nothing created or decided."""

from __future__ import annotations

import pytest

from agents import services
from agents.models import Approval, AuditEntry, Run
from dashboard import cli
from tests.support.flows import pending, start

REFUND = "Refund order A1001 for 25.00 USD"


def refused_usage(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a command that argparse must refuse; return its stderr."""
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    return captured.err


@pytest.mark.parametrize("group", ["approvals", "runs"])
@pytest.mark.parametrize("limit", ["-1", "0", "many", "1e3", "9" * 30])
def test_it_refuses_a_list_limit_that_is_not_a_positive_whole_number(db, capsys, group, limit):
    start(REFUND)

    err = refused_usage(capsys, group, "list", "--limit", limit)

    assert "--limit" in err and "at least 1" in err


@pytest.mark.parametrize("timeout", ["nan", "-1", "-inf"])
@pytest.mark.timeout(30)  # a NaN deadline never passed: the wait went on forever
def test_it_refuses_a_wait_timeout_that_is_not_a_number_of_seconds_and_starts_nothing(db, capsys, timeout):
    err = refused_usage(capsys, "runs", "start", "--agent", "support", "--wait", "--timeout", timeout, REFUND)

    assert "--timeout" in err
    assert not Run.objects.exists()


@pytest.mark.parametrize("wait", ["nan", "-1", "soon"])
def test_it_refuses_an_mcp_proxy_wait_that_is_not_a_number_of_seconds(db, capsys, wait):
    # A NaN wait never ran out: every asked call would have waited forever.
    err = refused_usage(capsys, "mcp-proxy", "--upstream", "true", "--wait", wait)

    assert "--wait" in err and "number of seconds" in err


@pytest.mark.parametrize(
    "listen",
    ["127.0.0.1:²", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:" + "9" * 5000, "127.0.0.1:", "8765", ":8765"],
)
def test_it_refuses_an_mcp_proxy_address_that_is_no_host_and_port_before_starting_anything(db, capsys, listen):
    services.user_create(username="mcp", role="agent")
    code = cli.main(["mcp-proxy", "--upstream", "true", "--listen", listen])

    captured = capsys.readouterr()
    assert code == 1 and "Traceback" not in captured.err
    assert captured.err == "agentfast: --listen must be HOST:PORT with a port from 1 to 65535, like 127.0.0.1:8765\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["approvals", "approve", "{id}", "--no-resume"],
        ["approvals", "reject", "{id}", "--no-resume"],
        ["approvals", "extend", "{id}", "--for", "1h"],
        ["runs", "cancel", "{run}"],
    ],
    ids=["approve", "reject", "extend", "cancel"],
)
def test_it_refuses_a_name_longer_than_the_audit_records_changing_nothing(db, capsys, argv):
    """A --by past the 150 characters a name is stored in was cut or refused by the database, vaguely."""
    run = start(REFUND)
    [approval] = pending(run)
    argv = [part.replace("{id}", approval.id).replace("{run}", run.id) for part in argv]

    code = cli.main([*argv, "--by", "x" * 151])
    captured = capsys.readouterr()

    assert code == 1
    assert captured.err == "agentfast: --by: at most 150 characters; nothing changed\n"
    assert Approval.objects.get(pk=approval.id).status == "pending"
    assert Run.objects.get(pk=run.id).status == "suspended"
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    ("by", "problem"),
    [
        ("   ", "--by: give a name"),
        ("ali\u202ece", "--by: contains U+202E, a control or invisible character"),
        ("alice\nbob", "--by: contains U+000A, a control or invisible character"),
    ],
    ids=["blank", "direction override", "newline"],
)
def test_it_refuses_a_name_that_would_record_nobody_or_pass_for_another(db, capsys, by, problem):
    # A blank decider was recorded as who approved; an override or a newline reads as someone else.
    run = start(REFUND)
    [approval] = pending(run)

    decided = cli.main(["approvals", "approve", approval.id, "--no-resume", "--by", by])
    started = cli.main(["runs", "start", "--agent", "support", "--inline", "--by", by, REFUND])

    assert (decided, started) == (1, 1)
    assert capsys.readouterr().err == f"agentfast: {problem}; nothing changed\n" * 2
    assert Approval.objects.get(pk=approval.id).status == "pending"
    assert Run.objects.count() == 1 and not AuditEntry.objects.exists()


def test_it_records_a_name_without_the_blanks_around_it(db, capsys):
    [approval] = pending(start(REFUND))

    assert cli.main(["approvals", "approve", approval.id, "--by", "  alice ", "--no-resume"]) == 0
    assert Approval.objects.get(pk=approval.id).decided_by == "alice"


def test_it_refuses_to_start_a_run_by_a_name_longer_than_the_column(db, capsys):
    code = cli.main(["runs", "start", "--agent", "support", "--inline", "--by", "x" * 151, REFUND])
    captured = capsys.readouterr()

    assert code == 1
    assert captured.err == "agentfast: --by: at most 150 characters; nothing changed\n"
    assert not Run.objects.exists()


def test_it_decides_as_a_name_of_exactly_150_characters(db, capsys):
    [approval] = pending(start(REFUND))

    assert cli.main(["approvals", "approve", approval.id, "--by", "x" * 150, "--no-resume"]) == 0
    assert Approval.objects.get(pk=approval.id).decided_by == "x" * 150
    assert AuditEntry.objects.get(approval_id=approval.id).actor == "x" * 150


def test_it_refuses_to_revoke_a_grant_by_a_name_longer_than_the_column(db, capsys):
    code = cli.main(["grants", "revoke", "1", "--by", "x" * 151])
    captured = capsys.readouterr()

    assert code == 1
    assert captured.err == "agentfast: --by: at most 150 characters; nothing changed\n"
    assert not AuditEntry.objects.exists()
