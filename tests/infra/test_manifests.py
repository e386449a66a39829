"""Infra files parse, and every BROKER_*/NODE_* variable they set is a real setting."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from broker.settings import BrokerSettings
from streamer.node.settings import NodeSettings

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
INFRA = Path(__file__).resolve().parents[2] / "infra"
KNOWN = {f"BROKER_{f.name.upper()}" for f in fields(BrokerSettings)} | {
    f"NODE_{f.name.upper()}" for f in fields(NodeSettings)}


@pytest.mark.parametrize("path", sorted(p for p in INFRA.rglob("*.yaml") if p.parent.name != "templates"),
                         ids=lambda p: p.name)  # the Helm chart's templates: tests/infra/test_helm.py
def test_yaml_parses(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs


@pytest.mark.parametrize("path", sorted(p for p in INFRA.rglob("*") if p.is_file()), ids=lambda p: p.name)
def test_env_names_are_real_settings(path: Path) -> None:
    names = set(re.findall(r"\b((?:BROKER|NODE)_[A-Z_]+)\b", path.read_text()))
    assert names - KNOWN == set(), f"{path.name} sets unknown settings"
