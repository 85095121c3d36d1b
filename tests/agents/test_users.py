"""Creating reviewers and admins: valid names, strong passwords, admin as a role."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from agents import cli, services
from agents.services.errors import InvalidInput


@pytest.mark.parametrize("password", ["a", "12345678", "password123", "qwertyuiop"])
def test_it_refuses_a_weak_password_with_the_validators_messages(db, password):
    with pytest.raises(InvalidInput) as refused:
        services.user_create(username="erin", role="reviewer", password=password)

    assert refused.value.details["field"] == "password"
    assert refused.value.message.startswith("the password is too weak: ")
    assert not User.objects.exists()


def test_it_names_every_weakness_of_a_password(db):
    with pytest.raises(InvalidInput) as refused:
        services.user_create(username="erin", role="reviewer", password="1234")

    assert "too short" in refused.value.message and "entirely numeric" in refused.value.message


def test_it_refuses_a_password_like_the_user_name(db):
    with pytest.raises(InvalidInput, match="too similar to the username"):
        services.user_create(username="bartholomew", role="reviewer", password="bartholomew1")


def test_it_refuses_a_weak_password_from_the_cli_in_one_line(db, capsys):
    code = cli.main(["users", "create", "erin", "--role", "admin", "--password", "a"])

    err = capsys.readouterr().err
    assert code == 1 and "too weak" in err and err.count("\n") == 1
    assert not User.objects.exists()


@pytest.mark.parametrize("password", ["", "   "], ids=["empty", "blank"])
def test_it_refuses_an_empty_password_from_the_cli_as_setting_one_does(db, capsys, password):
    # `--password "$PW"` with PW unset: a generated password would be printed to a script's log instead.
    services.user_create(username="erin", role="reviewer")
    assert cli.main(["users", "password", "erin", "--password", password]) == 1
    refused = capsys.readouterr().err

    code = cli.main(["users", "create", "fred", "--role", "reviewer", "--password", password])

    out, err = capsys.readouterr()
    assert code == 1 and err == refused and err.count("\n") == 1 and out == ""
    assert not User.objects.filter(username="fred").exists()


@pytest.mark.parametrize("password", [" " * 8, " " * 20, "\t \n        "], ids=["8-spaces", "20-spaces", "mixed"])
def test_it_refuses_a_password_of_whitespace_alone_from_the_cli(db, capsys, password):
    # Long enough, and no common password nor all digits: Django's own validators let it through.
    services.user_create(username="erin", role="reviewer", password="erin-password")
    assert cli.main(["users", "password", "erin", "--password", password]) == 1
    refused = capsys.readouterr().err

    code = cli.main(["users", "create", "fred", "--role", "reviewer", "--password", password])

    out, err = capsys.readouterr()
    assert refused == err == "agentfast: the password is too weak: This password is only whitespace.\n"
    assert code == 1 and out == ""
    assert not User.objects.filter(username="fred").exists()
    assert User.objects.get(username="erin").check_password("erin-password")


def test_it_refuses_a_password_of_whitespace_alone_on_the_password_change_page(db, client):
    erin, _ = services.user_create(username="erin", role="reviewer", password="erin-password")
    client.force_login(erin)

    response = client.post(
        "/accounts/password_change/",
        {"old_password": "erin-password", "new_password1": " " * 12, "new_password2": " " * 12},
    )

    assert response.status_code == 200  # the form again, with the reason
    assert "This password is only whitespace." in response.content.decode()
    assert User.objects.get(username="erin").check_password("erin-password")


def test_it_makes_a_password_when_the_cli_is_given_none(db, capsys):
    assert cli.main(["users", "create", "fred", "--role", "reviewer"]) == 0

    password = capsys.readouterr().out.rsplit(" with password ", 1)[1].strip()
    assert len(password) >= 16 and User.objects.get(username="fred").check_password(password)


@pytest.mark.parametrize(
    "email",
    ["erin", "erin@", "erin@example.com\nBcc: all@example.com", "a@example.com, b@example.com", "x" * 250 + "@e.com"],
    ids=["no-at", "no-domain", "header-break", "a-list", "too-long"],
)
def test_it_refuses_an_address_mail_cannot_go_to_in_one_line_from_the_cli(db, capsys, email):
    # Stored, it would fail every notification meant for this person, seen only on /deliveries.
    code = cli.main(["users", "create", "erin", "--role", "reviewer", "--email", email])

    err = capsys.readouterr().err
    assert code == 1 and "is not an email address" in err and err.count("\n") == 1
    assert not User.objects.exists()


def test_it_keeps_a_plain_address_and_none(db):
    assert services.user_create(username="erin", role="reviewer", email=" erin@example.com ")[0].email == (
        "erin@example.com"
    )
    assert services.user_create(username="fred", role="reviewer")[0].email == ""


def test_it_strips_the_user_name(db):
    user, _ = services.user_create(username="  erin ", role="reviewer")

    assert user.username == "erin"


@pytest.mark.parametrize("again", ["admin", "Admin", "admin ", " ADMIN"])
def test_it_refuses_a_name_that_differs_only_in_case_or_blanks(db, again):
    services.user_create(username="admin", role="admin")

    with pytest.raises(InvalidInput, match="already exists"):
        services.user_create(username=again, role="reviewer")
    assert User.objects.count() == 1


@pytest.mark.parametrize("name", ["", "   ", "bad name", "x/y", "a\x00b", "<script>", "e" * 151])
def test_it_refuses_an_invalid_user_name(db, name):
    with pytest.raises(InvalidInput) as refused:
        services.user_create(username=name, role="reviewer")

    assert refused.value.details["field"] == "username"
    assert not User.objects.exists()


def test_it_accepts_a_name_of_150_characters(db):
    user, _ = services.user_create(username="e" * 150, role="reviewer")

    assert len(user.username) == 150


def test_it_makes_an_admin_a_role_not_a_superuser(db, carol):
    assert not carol.is_superuser and carol.is_staff
    assert [g.name for g in carol.groups.all()] == ["admin"]
    for permission in ("decide_approval", "view_auditentry", "decide_on_behalf", "view_run", "view_toolcall"):
        assert carol.has_perm(f"agents.{permission}"), permission
    assert not carol.has_perm("agents.change_approval") and not carol.has_perm("auth.change_user")


def test_it_opens_the_read_only_django_admin_to_the_admin_role(client, carol, alice):
    client.force_login(carol)

    assert client.get("/admin/").status_code == 200
    for model in ("run", "approval", "auditentry", "toolcall", "apitoken"):
        assert client.get(f"/admin/agents/{model}/").status_code == 200, model
    assert client.get("/admin/agents/approval/add/").status_code == 403
    assert client.get("/admin/auth/user/").status_code == 403


def test_it_keeps_reviewers_out_of_the_django_admin(client, alice):
    client.force_login(alice)

    assert client.get("/admin/").status_code == 302
