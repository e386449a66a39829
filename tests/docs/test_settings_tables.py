"""docs/operations.md's settings tables are the ones the code generates (a setting added, renamed or
re-documented without the docs fails here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.settings import BrokerSettings
from rbcommon.settings import settings_table
from streamer.node.settings import NodeSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


@pytest.mark.parametrize(("cls", "env", "heading"), [
    (BrokerSettings, "BROKER_", "### Broker (`render-broker serve`, env `BROKER_*`)"),
    (NodeSettings, "NODE_", "### Render node (`render-node`, env `NODE_*`)"),
])
def test_the_settings_table_in_operations_md_is_generated_from_the_code(cls: type, env: str, heading: str) -> None:
    text = DOC.read_text()
    assert heading in text
    documented = text[text.index(heading) + len(heading):].strip().split("\n\n")[0]
    assert documented == settings_table(cls, env).strip(), (
        f"docs/operations.md's {env} settings table is stale: regenerate it (the commands are above it)")
