"""A rule's macros nested in each other: the bound on the lists they walk must bound the time they take."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from agents.policy.config import parse
from agents.policy.rules import MACRO_ITEMS, CallFacts, evaluate
from tests.conftest import ROOT

NESTED = """
tool_overrides:
  send_email:
    rules:
      - {name: listed, when: "args.to.all(r, args.allowed.map(a, a + '').exists(b, b == r))", action: allow}
      - {name: doubled, when: "args.to.exists(r, args.to.filter(s, s == r).size() > 1)", action: deny}
"""

# Each list within MACRO_ITEMS (1,000): one macro walks that many in about 50 ms. Nested, the
# inner quadratic `map` runs once per outer item: over 2 minutes here with the GIL held, the
# whole process (a worker's 100 threads, or the web process answering POST /api/gate) stopped;
# a third level, hours.
_EVALUATE = textwrap.dedent(
    f"""
    import yaml
    from pathlib import Path
    from agents.policy.config import parse
    from agents.policy.rules import CallFacts, evaluate
    policy = parse(yaml.safe_load({NESTED!r}), Path("agentfast.yaml"), version="v1")
    wide = [f"u{{i}}@corp.com" for i in range({MACRO_ITEMS})]
    verdict = evaluate(policy, CallFacts(tool="send_email", args={{"to": wide, "allowed": wide}}, agent="support"))
    print(verdict.action, verdict.reason)
    """
)


def test_nested_macros_over_lists_within_the_bound_are_not_walked_for_minutes():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    code = "import django; django.setup()\n" + _EVALUATE
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=20, check=False
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("a rule with nested macros held the process for over 20 s") from None

    assert done.returncode == 0, done.stderr
    action, _, reason = done.stdout.strip().partition(" ")
    assert action == "deny"  # fails closed: the deny rule counts as matching, the allow rule does not
    assert "could not be evaluated" in reason and "nested" in reason


def _verdict(to: list[str], allowed: list[str]) -> object:
    policy = parse(yaml.safe_load(NESTED), Path("agentfast.yaml"), version="v1")
    return evaluate(policy, CallFacts(tool="send_email", args={"to": to, "allowed": allowed}, agent="support"))


def test_nested_macros_still_evaluate_short_lists():
    allowed = [f"u{i}@corp.com" for i in range(50)]

    assert _verdict(["u1@corp.com", "u7@corp.com"], allowed).action == "allow"
    assert _verdict(["u1@corp.com", "u1@corp.com"], allowed).action == "deny"
    assert _verdict(["eve@example.com"], allowed).action == "ask"


def test_macros_one_after_another_still_walk_the_whole_bound():
    # `map(…).exists(…)` walks the list twice, not once per item: the single-macro bound still applies.
    text = """
tool_overrides:
  send_email:
    rules:
      - {name: doubled, when: "args.to.map(r, r + r).exists(rr, rr == 'xx')", action: deny}
"""
    policy = parse(yaml.safe_load(text), Path("agentfast.yaml"), version="v1")
    to = [f"u{i}@corp.com" for i in range(MACRO_ITEMS)]

    verdict = evaluate(policy, CallFacts(tool="send_email", args={"to": to}, agent="support"))

    assert verdict.action == "ask" and "could not be evaluated" not in verdict.reason
