"""agentfast.yaml files no person writes by hand: each is refused in one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.policy.config import ConfigError, load


@pytest.mark.parametrize(
    "nested", ["[" * 5000 + "]" * 5000, "{a: " * 3000 + "1" + "}" * 3000], ids=["lists", "mappings"]
)
def test_it_refuses_a_file_nested_too_deep_to_read_in_one_line(tmp_path: Path, nested: str):
    path = tmp_path / "agentfast.yaml"
    path.write_text(f"agents: {nested}\n")

    with pytest.raises(ConfigError) as error:
        load(path)

    message = str(error.value)
    assert message.startswith(f"{path}: not valid YAML: ")
    assert "nested" in message and "\n" not in message
