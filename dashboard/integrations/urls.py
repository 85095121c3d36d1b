"""Pages of the notification channels: one-click mail links, Slack's buttons, the deliveries log."""

from __future__ import annotations

from django.urls import path

from dashboard.integrations import deliveries, email, slack

urlpatterns = [
    path("integrations/email/<str:token>", email.one_click, name="integrations-email"),
    path("integrations/slack/actions", slack.actions, name="integrations-slack-actions"),
    path("deliveries", deliveries.delivery_list, name="deliveries"),
    path("deliveries/<int:delivery_id>/redeliver", deliveries.delivery_redeliver, name="delivery-redeliver"),
]
