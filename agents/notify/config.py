"""The `notifications:` entries of agentfast.yaml: who hears about which approval events, and how.

```yaml
notifications:
  - kind: webhook
    url: https://ops.example.com/hooks/agentfast
    secret_env: AGENTFAST_WEBHOOK_SECRET      # holds a whsec_… secret
    events: [approval.required, approval.decided]
  - kind: email
    to: [alice, group:finance]
    one_click: true
  - kind: slack
    webhook_url_env: SLACK_WEBHOOK_URL
```
An entry without `events` hears every event.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

EventType = Literal[
    "approval.required", "approval.decided", "approval.expired", "approval.reminder", "approval.escalated"
]
EVENTS: tuple[EventType, ...] = get_args(EventType)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_URL_CHARS = 500  # Delivery.target's max_length


class _Channel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    events: tuple[EventType, ...] = EVENTS

    def hears(self, event_type: str) -> bool:
        """Return whether this entry wants the event."""
        return event_type in self.events


def _env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError(f"must name an environment variable, not {value!r}")
    return value


class WebhookChannel(_Channel):
    kind: Literal["webhook"]
    url: StrictStr
    secret_env: StrictStr

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"must be an http(s) URL, not {value!r}")
        # Delivery.target holds this many: a longer URL, cut there, would never find its secret again.
        if len(value) > MAX_URL_CHARS:
            raise ValueError(f"must be at most {MAX_URL_CHARS} characters, not {len(value)}")
        return value

    @field_validator("secret_env")
    @classmethod
    def _secret_env(cls, value: str) -> str:
        return _env_name(value)


class EmailChannel(_Channel):
    kind: Literal["email"]
    to: tuple[StrictStr, ...] = Field(min_length=1)
    one_click: StrictBool = False


class SlackChannel(_Channel):
    kind: Literal["slack"]
    webhook_url_env: StrictStr

    @field_validator("webhook_url_env")
    @classmethod
    def _url_env(cls, value: str) -> str:
        return _env_name(value)


NotificationConfig = Annotated[WebhookChannel | EmailChannel | SlackChannel, Field(discriminator="kind")]
