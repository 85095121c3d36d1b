"""The models and the migrations agree: a model change shipped without its migration fails here, not in production."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command


def test_every_model_change_has_its_migration(db):
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit:  # --check exits 1 when a migration is missing
        raise AssertionError(f"a model change has no migration:\n{out.getvalue()}") from None
