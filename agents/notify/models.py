"""Rows of the notification channels: deliveries and their attempts, Slack links, one-click links."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Delivery(models.Model):
    """One event for one receiver (a webhook URL, a mail recipient, a chat channel); retried until it lands."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook"
        EMAIL = "email"
        SLACK = "slack"
        SLACK_RESPONSE = "slack_response"  # an update of a message someone clicked, through its response_url

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after the last attempt
        # Not sent: a message asking people to decide a call that was decided (or expired) before it went out.
        SUPERSEDED = "superseded"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    target = models.CharField(max_length=500)  # URL, username, or the env var naming a chat webhook
    event_type = models.CharField(max_length=40)
    approval_id = models.CharField(max_length=200, db_index=True)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # While an attempt is under way, when its claim runs out (renewed as it runs); None between attempts.
    # next_attempt_at holds the same instant then, but also a failed attempt's backoff: only this tells them apart.
    sending_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        # The deliveries page, newest first, of every status or of one.
        indexes = [
            models.Index(fields=["created_at", "id"], name="delivery_newest"),
            models.Index(fields=["status", "created_at", "id"], name="delivery_status_newest"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_type} → {self.target} ({self.status})"

    @property
    def sending(self) -> bool:
        """Return whether an attempt holds it now: another started beside it would send a second copy."""
        return (
            self.status == self.Status.PENDING
            and self.sending_until is not None
            and self.sending_until > timezone.now()
        )

    @property
    def webhook_id(self) -> str:
        """Return the id receivers deduplicate by: the same for every attempt of this delivery."""
        return f"msg_{self.pk}"


class DeliveryAttempt(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["delivery", "id"]

    def __str__(self) -> str:
        return f"{self.delivery_id}: {self.status_code or self.error[:40]}"


class PrunedFailures(models.Model):
    """Failed delivery attempts housekeeping deleted (one row): the failures counter adds them, so it never goes down."""

    count = models.BigIntegerField(default=0)


class SlackLink(models.Model):
    """Which agentfast user a Slack user is (`agentfast users link-slack NAME SLACK_ID`)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_link")
    slack_id = models.CharField(max_length=40, unique=True)

    def __str__(self) -> str:
        return f"{self.slack_id} → {self.user}"


class SlackRequest(models.Model):
    """A signature already accepted: the same signed request twice is a replay."""

    signature = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)


class OneClickLink(models.Model):
    """The nonce of a mailed link: used once, by the recipient it was sent to."""

    nonce = models.CharField(max_length=40, unique=True)
    approval_id = models.CharField(max_length=200, db_index=True)
    username = models.CharField(max_length=150)
    used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)  # housekeeping deletes by it

    def __str__(self) -> str:
        return f"{self.username} {self.approval_id} ({'used' if self.used_at else 'unused'})"
