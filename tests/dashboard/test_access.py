"""Who may see what: sign-in, roles (reviewer, admin), CSRF on every form."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from agents.models import Approval, AuditEntry


def reviewer_pages(approval: Approval) -> list[str]:
    return ["/", f"/approvals/{approval.id}", "/runs", f"/runs/{approval.run_id}"]


def test_it_shows_the_sign_in_page(client):
    response = client.get("/accounts/login/")

    assert response.status_code == 200
    assert b'name="csrfmiddlewaretoken"' in response.content
    assert b'name="username"' in response.content and b'name="password"' in response.content


def test_it_signs_a_reviewer_in_and_out(client, alice):
    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-password"})
    assert response.status_code == 302 and response.url == "/"
    assert b"alice" in client.get("/").content

    response = client.post("/accounts/logout/")
    assert response.status_code == 302 and response.url == "/accounts/login/"
    assert client.get("/").status_code == 302


def test_it_refuses_a_wrong_password_with_a_message(client, alice):
    response = client.post("/accounts/login/", {"username": "alice", "password": "nope"})

    assert response.status_code == 200
    assert b"Please enter a correct username and password" in response.content


def test_it_sends_anonymous_visitors_to_sign_in(client, approval):
    for url in [*reviewer_pages(approval), "/audit", "/audit.csv"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response.url.startswith("/accounts/login/?next="), url


def test_it_sends_an_anonymous_decision_to_sign_in_and_changes_nothing(client, approval):
    response = client.post(f"/approvals/{approval.id}/decide", {"decision": "approved"})

    assert response.status_code == 302 and response.url.startswith("/accounts/login/")
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_it_answers_a_signed_out_htmx_request_with_a_401_htmx_does_not_swap(client, approval):
    htmx = {"HX-Request": "true"}

    decided = client.post(f"/approvals/{approval.id}/decide", {"decision": "rejected", "note": "no"}, headers=htmx)
    listed = client.get("/", headers=htmx)

    for response in (decided, listed):
        assert response.status_code == 401 and "Location" not in response
        assert response.content.decode() == "You are signed out, so nothing was done: sign in again, then try again."
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert client.get("/").status_code == 302  # without htmx: the sign-in page, as before


def test_it_refuses_every_reviewer_page_to_a_user_without_a_role(client_for, dave, approval):
    client = client_for(dave)

    for url in reviewer_pages(approval):
        response = client.get(url)
        assert response.status_code == 403, url
        assert b"no reviewer role" in response.content


def test_it_refuses_and_audits_a_decision_from_a_user_without_a_role(client_for, dave, approval):
    response = client_for(dave).post(f"/approvals/{approval.id}/decide", {"decision": "approved"})

    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending"
    [entry] = AuditEntry.objects.all()
    assert (entry.actor, entry.action, entry.outcome, entry.source) == ("dave", "approved", "not_permitted", "web")


def test_it_keeps_the_audit_for_admins(client_for, alice, carol, approval):
    for url in ("/audit", "/audit.csv"):
        assert client_for(alice).get(url).status_code == 403
        assert client_for(carol).get(url).status_code == 200


def test_it_lets_an_admin_do_what_a_reviewer_does(client_for, carol, approval):
    client = client_for(carol)

    for url in reviewer_pages(approval):
        assert client.get(url).status_code == 200, url


def test_it_shows_the_audit_link_to_admins_only(client_for, alice, carol):
    assert b'href="/audit"' not in client_for(alice).get("/").content
    assert b'href="/audit"' in client_for(carol).get("/").content


@pytest.mark.parametrize("with_token", [False, True])
def test_it_requires_the_csrf_token_on_a_decision(alice, approval, with_token):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    page = client.get(f"/approvals/{approval.id}")
    headers = {"X-CSRFToken": str(page.context["csrf_token"])} if with_token else {}

    response = client.post(f"/approvals/{approval.id}/decide", {"decision": "approved"}, headers=headers)

    approval.refresh_from_db()
    if with_token:
        assert response.status_code == 302 and approval.status == "approved"
    else:
        assert response.status_code == 403 and approval.status == "pending"


def test_it_puts_the_csrf_token_where_htmx_sends_it(client_for, alice, approval):
    body = client_for(alice).get("/").content.decode()

    assert '<body hx-headers=\'{"X-CSRFToken": "' in body


def test_it_requires_the_csrf_token_to_sign_in(alice):
    client = Client(enforce_csrf_checks=True)

    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-password"})

    assert response.status_code == 403


def fail_to_sign_in(client: Client, username: str, times: int) -> list[int]:
    return [
        client.post("/accounts/login/", {"username": username, "password": "wrong-password"}).status_code
        for _ in range(times)
    ]


def test_it_locks_out_a_user_name_from_an_address_after_repeated_wrong_passwords(settings, alice, bob):
    client = Client()
    assert fail_to_sign_in(client, "alice", settings.AXES_FAILURE_LIMIT - 1) == [200] * (
        settings.AXES_FAILURE_LIMIT - 1
    )
    # The same name spelled otherwise counts too; the last allowed failure locks.
    assert fail_to_sign_in(client, "Alice ", 1) == [429]

    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-password"})

    assert response.status_code == 429
    assert b"Too many failed sign-ins" in response.content and b"try again in 15 minutes" in response.content
    assert client.get("/").status_code == 302  # not signed in
    # Another user from the same address, and alice from another address, still sign in.
    assert client.post("/accounts/login/", {"username": "bob", "password": "bob-password"}).status_code == 302
    elsewhere = Client(REMOTE_ADDR="192.0.2.44")
    assert elsewhere.post("/accounts/login/", {"username": "alice", "password": "alice-password"}).status_code == 302


def test_it_locks_out_one_client_behind_a_proxy_not_everyone_it_serves(settings, alice):
    # The proxy reaches `agentfast serve --host ::` over IPv4, so its address reads ::ffff:10.0.0.5.
    settings.AGENTFAST_TRUSTED_PROXIES = ["10.0.0.5"]
    through_proxy = {"REMOTE_ADDR": "::ffff:10.0.0.5"}
    guesser = Client(HTTP_X_FORWARDED_FOR="198.51.100.7", **through_proxy)

    assert fail_to_sign_in(guesser, "alice", settings.AXES_FAILURE_LIMIT)[-1] == 429

    alice_at_her_desk = Client(HTTP_X_FORWARDED_FOR="203.0.113.9", **through_proxy)
    signed_in = alice_at_her_desk.post("/accounts/login/", {"username": "alice", "password": "alice-password"})
    assert signed_in.status_code == 302


def test_it_forgets_failures_after_a_successful_sign_in(settings, alice):
    client = Client()
    assert set(fail_to_sign_in(client, "alice", settings.AXES_FAILURE_LIMIT - 1)) == {200}
    assert client.post("/accounts/login/", {"username": "alice", "password": "alice-password"}).status_code == 302
    client.post("/accounts/logout/")

    assert set(fail_to_sign_in(client, "alice", settings.AXES_FAILURE_LIMIT - 1)) == {200}

    assert client.post("/accounts/login/", {"username": "alice", "password": "alice-password"}).status_code == 302


def test_it_locks_out_the_django_admin_sign_in_too(settings, carol):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/admin/login/", {"username": "carol", "password": "wrong-password"})

    response = client.post("/admin/login/", {"username": "carol", "password": "carol-password"})

    assert response.status_code == 429


def test_it_lets_a_user_without_a_role_sign_out_from_the_refusal(client_for, dave):
    client = client_for(dave)
    page = client.get("/runs")
    assert page.status_code == 403 and b'action="/accounts/logout/"' in page.content

    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/runs").status_code == 302


def test_a_tokens_user_comes_with_the_same_permissions_django_reads(alice, carol):
    from django.contrib.auth.backends import ModelBackend
    from django.contrib.auth.models import Permission, User

    from agents import services
    from dashboard.auth import ON_BEHALF

    alice.user_permissions.add(Permission.objects.get(codename="decide_on_behalf"))  # her own, beside her group's
    superuser = User.objects.create_superuser("root", password="pw")
    for user in (alice, carol, superuser):
        authenticated = services.token_authenticate(services.token_create(username=user.username)[1])
        assert authenticated == user
        expected = ModelBackend().get_all_permissions(User.objects.get(pk=user.pk))
        assert getattr(authenticated, "_perm_cache", expected) == expected
        assert expected  # each has some: the union lost none
    authenticated = services.token_authenticate(services.token_create(username="alice")[1])
    assert authenticated is not None and authenticated._perm_cache  # read with the token, not by has_perm
    assert authenticated.has_perm(ON_BEHALF) and not authenticated.has_perm("agents.view_auditentry")
    assert not hasattr(services.token_authenticate(services.token_create(username="root")[1]), "_perm_cache")


def test_it_logs_a_refused_page_without_a_traceback(alice, client_for, caplog):
    caplog.set_level(logging.WARNING)

    assert client_for(alice).get("/audit").status_code == 403

    assert not [record for record in caplog.records if record.name == "django.request"]
