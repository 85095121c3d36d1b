"""The `agentfast` CLI: every command, its --json shapes, and one clear line for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agents.models import Approval, AuditEntry, Run, SideEffect
from dashboard import cli
from tests.conftest import ROOT, child_env, wait_for
from tests.support.flows import decide, pending, start

REFUND = "Refund order A1001 for 25.00 USD"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_it_starts_a_run_inline_and_prints_its_id_and_status_as_json(db, capsys):
    code, out, _ = run_cli(capsys, "runs", "start", "--agent", "support", "--inline", "--json", REFUND)

    assert code == 0
    body = json.loads(out)
    assert set(body) == {"id", "status"} and body["status"] == "suspended"
    assert Run.objects.get(pk=body["id"]).status == "suspended"


def test_it_lists_and_shows_approvals(db, capsys):
    run = start(REFUND)
    [approval] = pending(run)

    code, out, _ = run_cli(capsys, "approvals", "list", "--json")
    assert code == 0
    [row] = json.loads(out)
    assert set(row) == {"id", "run_id", "tool", "arguments", "mode", "status", "created_at"}
    assert (row["id"], row["run_id"], row["tool"], row["mode"]) == (approval.id, run.id, "refund_request", "suspend")

    code, out, _ = run_cli(capsys, "approvals", "list")
    assert approval.id in out and "refund_request" in out and out.startswith("ID")

    code, out, _ = run_cli(capsys, "approvals", "show", approval.id, "--json")
    detail = json.loads(out)
    assert {"decided_by", "decided_at", "note"} <= set(detail)
    assert detail["arguments"] == {"order_id": "A1001", "amount_cents": 2500}


def test_it_approves_through_the_cli_and_the_run_finishes(db, capsys):
    run = start(REFUND)
    [approval] = pending(run)

    code, out, _ = run_cli(capsys, "approvals", "approve", approval.id, "--by", "alice@ops", "--no-resume")
    assert code == 0 and "Approved" in out
    code, out, _ = run_cli(capsys, "runs", "resume", run.id, "--inline", "--json")
    assert code == 0 and json.loads(out)["status"] == "completed"

    code, out, _ = run_cli(capsys, "runs", "show", run.id, "--json")
    shown = json.loads(out)
    assert shown["status"] == "completed"
    assert {"call_id", "name", "arguments", "status", "executed_at", "result"} <= set(shown["tool_calls"][1])
    assert shown["approvals"] == [
        {
            "id": approval.id,
            "tool": "refund_request",
            "mode": "suspend",
            "status": "approved",
            "decided_by": "alice@ops",
            "note": "",
        }
    ]
    assert AuditEntry.objects.get(approval_id=approval.id).source == "cli"

    code, out, _ = run_cli(capsys, "effects", "list", "--json")
    [effect] = json.loads(out)
    assert set(effect) == {"tool", "idempotency_key", "arguments", "created_at"}
    assert effect["idempotency_key"] == approval.id


def test_it_rejects_with_a_note_and_edits_arguments(db, capsys):
    run = start(REFUND)
    [approval] = pending(run)
    code, _, _ = run_cli(
        capsys,
        "approvals",
        "reject",
        approval.id,
        "--by",
        "alice@ops",
        "--note",
        "customer already refunded",
        "--no-resume",
    )
    assert code == 0
    assert Approval.objects.get(pk=approval.id).note == "customer already refunded"

    other = start(REFUND)
    [edit] = pending(other)
    code, _, _ = run_cli(
        capsys,
        "approvals",
        "approve",
        edit.id,
        "--by",
        "alice@ops",
        "--no-resume",
        "--args",
        '{"order_id": "A1001", "amount_cents": 1200}',
    )
    assert code == 0
    assert Approval.objects.get(pk=edit.id).arguments == {"order_id": "A1001", "amount_cents": 1200}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["approvals", "approve", "appr_missing", "--by", "a"], "no approval appr_missing"),
        (["approvals", "show", "appr_missing"], "no approval appr_missing"),
        (["runs", "show", "run_missing"], "no run run_missing"),
        (["runs", "start", "--agent", "nobody", "--inline", "hi"], "unknown agent 'nobody'"),
    ],
)
def test_it_exits_non_zero_with_one_line_for_unknown_things(db, capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)

    assert code == 1
    assert err.count("\n") == 1 and message in err and err.startswith("agentfast: ")
    assert not Run.objects.exists() or argv[0] != "runs" or argv[1] != "start"


def test_it_refuses_bad_arguments_and_a_second_different_decision_changing_nothing(db, capsys):
    run = start(REFUND)
    [approval] = pending(run)

    code, _, err = run_cli(capsys, "approvals", "approve", approval.id, "--by", "a", "--args", "{not json")
    assert code == 1 and "--args: not valid JSON" in err and err.count("\n") == 1
    code, _, err = run_cli(
        capsys, "approvals", "approve", approval.id, "--by", "a", "--args", '{"order_id": "A1001", "amount_cents": "x"}'
    )
    assert code == 1 and "amount_cents" in err and err.count("\n") == 1
    assert Approval.objects.get(pk=approval.id).status == "pending"

    assert run_cli(capsys, "approvals", "approve", approval.id, "--by", "alice", "--no-resume")[0] == 0
    code, _, err = run_cli(capsys, "approvals", "reject", approval.id, "--by", "bob")
    assert code == 1 and "already approved by alice" in err
    assert Approval.objects.get(pk=approval.id).status == "approved"


def test_it_refuses_to_start_a_run_without_a_broker_and_creates_nothing(db, capsys, redis_server):
    redis_server.stop()
    try:
        code, _, err = run_cli(capsys, "runs", "start", "--agent", "support", REFUND)
    finally:
        redis_server.start()

    assert code == 1 and "cannot reach the broker" in err and err.count("\n") == 1
    assert not Run.objects.exists()


def test_it_prints_the_run_as_json_when_wait_times_out_so_a_script_keeps_its_id(db, capsys, broker):
    # No worker takes the run: the wait runs out, but the run exists and the script must be able to find it.
    code, out, err = run_cli(
        capsys, "runs", "start", "--agent", "support", "--wait", "--timeout", "0.2", "--json", REFUND
    )

    assert code == 1
    body = json.loads(out)
    assert body == {"id": Run.objects.get().id, "status": "queued"}
    assert err.startswith(f"agentfast: {body['id']} did not pause or finish within 0.2s") and err.count("\n") == 1


def test_it_creates_users_with_roles(db, capsys):
    code, out, _ = run_cli(capsys, "users", "create", "dora", "--role", "reviewer")
    assert code == 0 and "created reviewer dora with password" in out
    code, _, err = run_cli(capsys, "users", "create", "dora", "--role", "admin")
    assert code == 1 and "already exists" in err

    from django.contrib.auth.models import User

    dora = User.objects.get(username="dora")
    assert dora.has_perm("agents.decide_approval") and not dora.has_perm("agents.view_auditentry")


@pytest.mark.integration
def test_it_runs_the_readme_flow_with_the_console_script_and_a_worker(start_worker):
    """The README's four commands, as separate processes, with a real worker resuming."""
    start_worker()
    env = child_env()
    agentfast = [sys.executable, "-m", "dashboard.cli"]

    def call(*argv: str) -> str:
        done = subprocess.run([*agentfast, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    started = json.loads(call("runs", "start", "--agent", "support", "--wait", "--json", REFUND))
    assert started["status"] == "suspended"
    [row] = json.loads(call("approvals", "list", "--json"))
    call("approvals", "approve", row["id"], "--by", "alice@ops")

    wait_for(lambda: Run.objects.get(pk=started["id"]).status == "completed", what="the worker to resume the run")
    shown = json.loads(call("runs", "show", started["id"], "--json"))
    assert "Refunded 25.00 USD" in shown["messages"][-1]["content"]
    assert SideEffect.objects.filter(idempotency_key=row["id"]).count() == 1


def test_it_creates_and_revokes_api_tokens(db, capsys, alice):
    from agents import services

    code, out, _ = run_cli(capsys, "tokens", "create", "alice")
    token = out.strip()
    assert code == 0 and token.startswith("af_")
    assert services.token_authenticate(token) == alice
    assert services.token_authenticate(token + "x") is None

    code, out, _ = run_cli(capsys, "tokens", "revoke", token)
    assert code == 0 and "revoked" in out
    assert services.token_authenticate(token) is None
    code, _, err = run_cli(capsys, "tokens", "create", "nobody")
    assert code == 1 and "no active user 'nobody'" in err


def test_it_refuses_a_token_name_longer_than_the_column_and_creates_nothing(db, capsys, alice):
    from agents.models import ApiToken

    code, _, err = run_cli(capsys, "tokens", "create", "alice", "--name", "n" * 5000)

    assert (code, err) == (1, "agentfast: a token's name is at most 100 characters, not 5000\n")
    assert not ApiToken.objects.exists()
    code, _, _ = run_cli(capsys, "tokens", "create", "alice", "--name", "n" * 100)
    assert code == 0 and ApiToken.objects.get().name == "n" * 100


def _start_inline(capsys: pytest.CaptureFixture[str], prompt: str) -> dict:
    code, out, err = run_cli(capsys, "runs", "start", "--agent", "support", "--inline", "--json", prompt)
    assert code == 0, err
    return json.loads(out)


def _pending_ids(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [row["id"] for row in json.loads(run_cli(capsys, "approvals", "list", "--json")[1])]


def _show(capsys: pytest.CaptureFixture[str], run_id: str) -> dict:
    return json.loads(run_cli(capsys, "runs", "show", run_id, "--json")[1])


def test_it_revises_through_the_cli_with_feedback(db, capsys):
    run = _start_inline(capsys, REFUND)
    [first] = _pending_ids(capsys)

    run_cli(capsys, "approvals", "reject", first, "--by", "alice", "--feedback", "make it 20.00", "--no-resume")
    run_cli(capsys, "runs", "resume", run["id"], "--inline")
    [second] = _pending_ids(capsys)
    run_cli(capsys, "approvals", "approve", second, "--by", "alice", "--no-resume")
    run_cli(capsys, "runs", "resume", run["id"], "--inline")

    assert _show(capsys, run["id"])["status"] == "completed"
    assert [e.arguments["amount_cents"] for e in SideEffect.objects.all()] == [2000]


def test_it_decides_parallel_calls_through_the_cli_resuming_after_both(db, capsys):
    run = _start_inline(capsys, "Refund orders A1001 and A1002 for 20.00 USD each")
    first, second = _pending_ids(capsys)

    run_cli(capsys, "approvals", "approve", first, "--by", "alice", "--no-resume")
    code, _, err = run_cli(capsys, "runs", "resume", run["id"], "--inline")
    assert code == 1 and "waits on 1 pending approval" in err
    run_cli(capsys, "approvals", "approve", second, "--by", "alice", "--no-resume")
    run_cli(capsys, "runs", "resume", run["id"], "--inline")

    assert _show(capsys, run["id"])["status"] == "completed"
    assert SideEffect.objects.count() == 2


def test_it_answers_a_tool_that_asks_through_the_cli(db, capsys):
    run = _start_inline(capsys, "Ask a human whether to expedite order A1003")
    [approval_id] = _pending_ids(capsys)

    code, out, _ = run_cli(capsys, "approvals", "show", approval_id)
    assert "Should we expedite order A1003?" in out
    run_cli(capsys, "approvals", "approve", approval_id, "--by", "alice", "--answer", "yes", "--no-resume")
    run_cli(capsys, "runs", "resume", run["id"], "--inline")

    assert _show(capsys, run["id"])["messages"][-1]["content"] == "A person answered: yes"


def test_it_defers_an_email_and_shows_the_check_before_asking_through_the_cli(db, capsys):
    deferred = _start_inline(capsys, "Email bob@example.com that his refund is on its way")
    assert deferred["status"] == "completed"
    [approval_id] = _pending_ids(capsys)
    assert Approval.objects.get(pk=approval_id).mode == "defer"

    checked = _start_inline(capsys, "Refund order A1001 for 80.00 USD")
    assert checked["status"] == "completed"
    assert _pending_ids(capsys) == [approval_id]  # nobody was asked about the refund
    assert "at most the order total" in _show(capsys, checked["id"])["tool_calls"][-1]["result"]["message"]


def agentfast(*argv: str | bytes, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the console script's module in a child process; argv may hold raw bytes, as a shell passes them."""
    args = [sys.executable, "-m", "dashboard.cli", *(a if isinstance(a, bytes) else a.encode() for a in argv)]
    return subprocess.run(
        args, cwd=ROOT, env=child_env(**env), capture_output=True, text=True, errors="replace", timeout=60, check=False
    )


def assert_one_line(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("agentfast: ") and all(n in done.stderr for n in needles), done.stderr


INVALID_UTF8 = b"caf\xe9 \xff"


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        ([b"approve", b"{id}", b"--by", b"alice", b"--note", INVALID_UTF8], "--note"),
        ([b"reject", b"{id}", b"--by", b"alice", b"--feedback", INVALID_UTF8], "--feedback"),
        ([b"approve", b"{id}", b"--by", INVALID_UTF8], "--by"),
    ],
)
def test_it_refuses_invalid_utf8_in_decisions_naming_the_option(transactional_db, argv, option):
    [approval] = pending(start(REFUND))

    done = agentfast("approvals", *(a.replace(b"{id}", approval.id.encode()) for a in argv))

    assert_one_line(done, option, "not valid text")
    assert Approval.objects.get(pk=approval.id).status == "pending"
    assert not AuditEntry.objects.exists()


def test_it_refuses_invalid_utf8_in_a_prompt_and_starts_nothing(transactional_db):
    done = agentfast("runs", "start", "--agent", "support", "--inline", b"Refund order A1001 \xff")

    assert_one_line(done, "PROMPT", "not valid text")
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("--args", '{"order_id": "A1001", "amount_cents": NaN}', "NaN is not a JSON number"),
        ("--args", '{"order_id": "A1001", "amount_cents": -Infinity}', "-Infinity is not a JSON number"),
        ("--payload", '{"answer": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper than"),
        ("--args", '{"order_id": "\\ud800", "amount_cents": 100}', "lone surrogate"),
        ("--args", '{"order_id": "A1001", "order_id": "A1002", "amount_cents": 100}', "'order_id' appears twice"),
        ("--payload", '{"answer": {"text": "yes", "text": "no"}}', "'text' appears twice"),
        ("--args", '{"order_id": "A1001", "amount_cents": ' + "9" * 5001 + "}", "a number is too long"),
    ],
    ids=["nan", "infinity", "deep", "surrogate", "duplicate", "nested-duplicate", "long-number"],
)
def test_it_refuses_nan_infinity_and_deep_nesting_in_json_options(transactional_db, option, value, problem):
    [approval] = pending(start(REFUND))

    done = agentfast("approvals", "approve", approval.id, "--by", "alice", "--no-resume", option, value)

    assert_one_line(done, option, problem)
    assert Approval.objects.get(pk=approval.id).status == "pending"


@pytest.mark.parametrize(
    "content",
    [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "agents:\n  caf\xe9: {model: demo}\n".encode("latin-1")],
    ids=["binary", "latin-1"],
)
def test_it_reports_an_unreadable_config_file_in_one_line(db, tmp_path, content):
    config = tmp_path / "agentfast.yaml"
    config.write_bytes(content)

    done = agentfast("runs", "list", AGENTFAST_CONFIG=str(config))

    assert_one_line(done, str(config))


def test_it_exits_quietly_when_the_reader_closes_the_pipe(db):
    """`agentfast runs list | head -1`: the reader is gone before the command writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dashboard.cli", "runs", "list"],
            cwd=ROOT,
            env=child_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)

    assert done.stderr == ""
    assert done.returncode == 1


def test_it_refuses_an_unknown_run_status_with_the_choices(db, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["runs", "list", "--status", "bogus"])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err and "suspended" in err


def test_it_offers_every_run_status_of_the_model():
    from agents.cli.runs import RUN_STATUSES

    assert set(RUN_STATUSES) == set(Run.Status.values)


# -- stored text reaches a terminal as text, never as its commands -------------------------

HOSTILE = "\u001b]0;PWNED\u0007\u001b[31mrefund approved\u001b[2K\r\x01\x7f\x9b2J \u202e0001A\u202c"
RAW_CONTROLS = ("\x1b", "\x07", "\r", "\x01", "\x7f", "\x9b", "\u202e", "\u202c")


def test_it_shows_terminal_controls_in_stored_text_as_escapes(db, capsys):
    run = start(f"{REFUND} {HOSTILE}")
    [approval] = pending(run)
    decide(approval, "rejected", by="ali\x1b[8mce", note=f"no {HOSTILE}")

    for argv in (["runs", "show", run.id], ["runs", "list"], ["approvals", "show", approval.id]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 0, err
        assert not any(control in out for control in RAW_CONTROLS), (argv, out)
        assert "\\x1b]0;PWNED\\x07\\x1b[31m" in out, (argv, out)
    assert "ali\\x1b[8mce" in out and "\\x9b2J" in out and "\n" in out  # newlines keep their meaning
    assert "\\u202e0001A\\u202c" in out  # a right-to-left override shown, not obeyed


def test_it_prints_json_whose_controls_are_escaped_and_whose_values_are_exact(db, capsys):
    run = start(f"{REFUND} {HOSTILE}")

    code, out, _ = run_cli(capsys, "runs", "show", run.id, "--json")

    assert code == 0
    assert not any(control in out for control in RAW_CONTROLS), out
    assert json.loads(out)["input"] == f"{REFUND} {HOSTILE}"


def test_it_shows_controls_in_a_one_line_refusal_as_escapes(db, capsys):
    code, _, err = run_cli(capsys, "runs", "show", "run_\x1b]0;PWNED\x07")

    assert code == 1
    assert err == "agentfast: no run run_\\x1b]0;PWNED\\x07\n"


@pytest.mark.parametrize("by", ["", "  "], ids=["empty", "blank"])
def test_it_refuses_to_cancel_a_run_without_saying_who_cancels(db, capsys, by):
    run = start(REFUND)

    code, _, err = run_cli(capsys, "runs", "cancel", run.id, "--by", by)

    assert (code, err) == (1, "agentfast: --by: give a name; nothing changed\n")
    assert Run.objects.get(pk=run.id).status == "suspended"
    assert not AuditEntry.objects.filter(run_id=run.id).exists()


def test_it_refuses_a_var_folder_that_does_not_exist_and_creates_nothing(db, tmp_path):
    missing = tmp_path / "nonexistent" / "zz"
    for argv in (["runs", "list"], ["approvals", "show", "appr_x"], ["tokens", "create", "alice"]):
        done = agentfast(*argv, DJANGO_SETTINGS_MODULE="dashboard.settings", AGENTFAST_VAR_DIR=str(missing))

        assert_one_line(done, "AGENTFAST_VAR_DIR", str(missing), "does not exist")
    assert not missing.parent.exists()  # no empty database, no new secret key


@pytest.mark.parametrize(
    ("url", "says"),
    [("garbage", "not a database URL"), ("postgres://app:s3cret@db.internal:5432/", "names no database")],
)
def test_it_reports_a_malformed_database_url_in_one_line_without_its_password(db, url, says):
    done = agentfast("runs", "list", DATABASE_URL=url)

    assert_one_line(done, "DATABASE_URL", says)
    assert "s3cret" not in done.stderr
