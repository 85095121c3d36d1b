"""The pages can run under a Content-Security-Policy without inline script: no template holds
script that is not a file of ours, and htmx is told never to evaluate code from attributes."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

from django.conf import settings

TEMPLATES = Path(settings.BASE_DIR) / "templates"
STATIC_JS = Path(settings.BASE_DIR) / "static" / "js"
URL_ATTRIBUTES = {"href", "src", "action", "formaction", "hx-get", "hx-post", "hx-put", "hx-delete"}


class _InlineScript(HTMLParser):
    """Collect what a strict `script-src 'self'` would block, as readable findings."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.findings: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "script" and not names.get("src"):
            self.findings.append("<script> without src")
        for name, value in attrs:
            text = (value or "").strip().lower()
            if re.fullmatch(r"on[a-z]+", name) or name.startswith(("hx-on", "data-hx-on")):
                self.findings.append(f"handler attribute {name}=")
            elif name in URL_ATTRIBUTES and text.startswith("javascript:"):
                self.findings.append(f"javascript: URL in {name}")
            elif name in ("hx-vals", "hx-headers", "hx-vars") and text.startswith(("js:", "javascript:")):
                self.findings.append(f"code in {name}")
            elif name == "hx-trigger" and "[" in text:
                self.findings.append("hx-trigger filter (evaluated code)")


def inline_script(html: str) -> list[str]:
    parser = _InlineScript()
    parser.feed(html)
    return parser.findings


def test_it_finds_inline_script_when_there_is_some():
    # The scanner itself: each of these is blocked by `script-src 'self'`.
    assert inline_script("<script>alert(1)</script>") == ["<script> without src"]
    assert inline_script('<button onclick="go()">') == ["handler attribute onclick="]
    assert inline_script('<div hx-on:click="go()" hx-on::after-request="x">') == [
        "handler attribute hx-on:click=",
        "handler attribute hx-on::after-request=",
    ]
    assert inline_script('<a href=" JavaScript:go()">') == ["javascript: URL in href"]
    assert inline_script("<p hx-vals='js:{a: 1}' hx-trigger=\"keyup[key=='Enter']\">") == [
        "code in hx-vals",
        "hx-trigger filter (evaluated code)",
    ]
    assert inline_script('<script src="/static/js/app.js"></script><a href="/">') == []


def test_it_keeps_every_template_free_of_inline_script():
    templates = sorted(TEMPLATES.rglob("*.html"))
    assert len(templates) > 10

    findings = {str(path.relative_to(TEMPLATES)): inline_script(path.read_text()) for path in templates}

    assert {name: found for name, found in findings.items() if found} == {}


def test_it_tells_htmx_never_to_evaluate_code():
    base = (TEMPLATES / "base.html").read_text()
    config = json.loads(re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", base).group(1))

    assert config["allowEval"] is False and config["allowScriptTags"] is False
    assert config["includeIndicatorStyles"] is False


def test_it_keeps_our_scripts_free_of_eval():
    for script in STATIC_JS.glob("*.js"):
        code = script.read_text()
        assert not re.search(r"\beval\s*\(|new\s+Function\s*\(|setTimeout\s*\(\s*[\"']", code), script.name


def test_it_closes_every_template_comment_on_its_line():
    # Django's {# #} comments are one line: an unclosed one prints the rest as text (here, htmx's config).
    for path in TEMPLATES.rglob("*.html"):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            assert line.count("{#") == line.count("#}"), f"{path.name}:{number}"
