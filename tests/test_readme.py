# SPDX-License-Identifier: Apache-2.0
"""The README's configuration and metric tables are the code's: a new option or metric must show up there."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from otel_gpu import config, semconv
from tests.conftest import REPO


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_readme_tables", REPO / "scripts" / "gen_readme_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _between(text: str, name: str) -> str:
    return text.split(f"<!-- {name}-table -->\n", 1)[1].split(f"<!-- /{name}-table -->", 1)[0]


def test_readme_tables_match_config_and_semconv() -> None:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_readme_tables.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_readme_gives_the_two_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert "make run" in text and "make test" in text


def test_the_configuration_table_lists_every_flag_and_variable_and_the_metric_table_every_metric() -> None:
    text = (REPO / "README.md").read_text()
    rows = _between(text, "config").splitlines()
    assert len(rows) == 2 + len(config.OPTIONS)
    for option in config.OPTIONS:
        row = next((r for r in rows if r.startswith(f"| `{option.flag}")), "")
        assert row, option.flag
        for name in option.env:
            assert f"`{name}`" in row, (option.flag, name)
    metrics = _between(text, "metrics")
    for spec in semconv.GPU_METRICS + semconv.NVLINK_METRICS + semconv.GPU_TIME_METRICS + semconv.SELF_METRICS:
        assert f"| `{spec.name}` |" in metrics, spec.name


def test_empty_or_missing_tables_are_filled_or_refused() -> None:
    """The tables were empty: the pattern needed a line between the markers, so it matched nothing and --check
    compared an empty README with itself."""
    generator = _generator()
    filled = generator.render("a\n<!-- config-table -->\n<!-- /config-table -->\n"
                              "<!-- metrics-table -->\n<!-- /metrics-table -->\n")
    assert "`--otlp-endpoint`" in _between(filled, "config") and "otel_gpu.dropped" in _between(filled, "metrics")
    assert generator.render(filled) == filled
    with pytest.raises(ValueError, match="config-table"):
        generator.render("no markers\n")


def test_the_metric_table_gives_victoria_metrics_own_name_where_it_differs() -> None:
    """VictoriaMetrics adds _ratio to up-down counters of unit 1 too: the table names both, so an alert written from
    it finds the series on either backend."""
    rows = {row.split(" | ")[0].strip("| `"): row for row in _between((REPO / "README.md").read_text(),
                                                                      "metrics").splitlines()}
    assert "`hw_status` (VictoriaMetrics: `hw_status_ratio`)" in rows["hw.status"]
    assert "`otel_gpu_source_up` (VictoriaMetrics: `otel_gpu_source_up_ratio`)" in rows["otel_gpu.source.up"]
    assert "VictoriaMetrics" not in rows["hw.gpu.utilization"]  # a gauge: the same name everywhere
