"""A person's text that cannot be stored reaches every caller of the services as InvalidInput naming its field."""

from __future__ import annotations

import pytest

from agents import text
from agents.services.errors import InvalidInput, unsafe_text_refused


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (lambda: text.require_clean("a\x00b", field="note"), "note: contains a NUL character"),
        (lambda: text.require_plain_name("a\u200bb", field="group"), "group: contains U+200B"),
        (lambda: text.loads_strict("[NaN]", field="arguments"), "arguments: NaN is not a JSON number"),
    ],
    ids=["nul", "invisible", "nan"],
)
def test_it_refuses_unsafe_text_as_invalid_input_naming_its_field(check, message):
    with pytest.raises(InvalidInput) as refused, unsafe_text_refused():
        check()

    assert refused.value.message.startswith(message)
    assert refused.value.details == {"field": message.split(":")[0]}
    assert refused.value.__suppress_context__  # one error to report, not UnsafeText "during handling" of it


def test_it_lets_clean_text_and_other_errors_through():
    with unsafe_text_refused():
        assert text.require_clean("fine", field="note") == "fine"

    with pytest.raises(KeyError), unsafe_text_refused():
        raise KeyError("not about text")
