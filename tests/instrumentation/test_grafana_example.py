# SPDX-License-Identifier: Apache-2.0
"""The Grafana traces-to-profiles example names the profile types the agent really emits."""

from __future__ import annotations

from pathlib import Path

import yaml

from otel_gpu.profiles.model import ProfileBatch
from otel_gpu.profiles.otlp import encode_otlp
from tests.profiles import batches
from tests.profiles.pyroscope_rules import profile_type_ids

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "traces-to-profiles.yaml"


def _type_ids(batch: ProfileBatch) -> list[str]:
    return profile_type_ids(encode_otlp(batch))


def test_every_tempo_source_links_to_a_profile_type_the_agent_emits() -> None:
    sources = yaml.safe_load(EXAMPLE.read_text())["datasources"]
    pyroscope = {s["uid"] for s in sources if s["type"] == "grafana-pyroscope-datasource"}
    links = [s["jsonData"]["tracesToProfiles"] for s in sources if s["type"] == "tempo"]
    assert {link["datasourceUid"] for link in links} <= pyroscope
    agent_batches = (batches.cpu_batch(), batches.gpu_batch(), batches.sync_wait_batch())
    emitted = {t for batch in agent_batches for t in _type_ids(batch)}
    assert {link["profileTypeId"] for link in links} == emitted
