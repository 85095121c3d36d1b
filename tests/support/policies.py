"""agentfast.yaml texts for the policy tests: the demo support agent with who-decides settings."""

from __future__ import annotations

import json
from typing import Any

SUPPORT = """
agents:
  support:
    model: demo
    tools: [lookup_order, refund_request, send_email, ask_human]
tool_overrides:
  refund_request: {refund}
  send_email: {{risk: high, hitl_mode: defer}}
"""


def support_yaml(**refund: Any) -> str:
    """Return a config whose refund_request has these keys (approvers, quorum, four_eyes…)."""
    return SUPPORT.format(refund=json.dumps({"risk": "high", "hitl_mode": "suspend", **refund}))
