#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Regenerate the configuration and metric tables of README.md from otel_gpu.config and otel_gpu.semconv.

    .venv/bin/python scripts/gen_readme_tables.py          rewrite README.md in place
    .venv/bin/python scripts/gen_readme_tables.py --check  exit 1 when README.md is out of date (a test runs this)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from otel_gpu import config, semconv  # noqa: E402


def config_table() -> str:
    defaults = config.AgentConfig()
    rows = ["| flag | environment | YAML key | default | meaning |", "|---|---|---|---|---|"]
    for option in config.OPTIONS:
        default = config._render(config._get(defaults, option.path), option)
        flag = option.flag + (f" / --no-{option.flag[2:]}" if option.boolean else "")
        choices = f" ({', '.join(c for c in option.choices if c)})" if option.choices else ""
        env = ", ".join(f"`{name}`" for name in option.env)
        shown = f"`{default}`" if str(default) != "" else ""
        meaning = f"{option.help}{choices}".replace("|", "\\|")
        rows.append(f"| `{flag}` | {env} | `{option.path}` | {shown} | {meaning} |")
    return "\n".join(rows)


def metric_table() -> str:
    rows = ["| OpenTelemetry name | instrument | unit | Prometheus name | meaning |", "|---|---|---|---|---|"]
    for spec in semconv.GPU_METRICS + semconv.NVLINK_METRICS + semconv.GPU_TIME_METRICS + semconv.SELF_METRICS:
        name, vm_name = semconv.prometheus_name(spec), semconv.victoria_metrics_name(spec)
        shown = f"`{name}`" + (f" (VictoriaMetrics: `{vm_name}`)" if vm_name != name else "")
        rows.append(f"| `{spec.name}` | {spec.instrument} | `{spec.unit}` | {shown} | {spec.description} |")
    return "\n".join(rows)


def render(text: str) -> str:
    """``text`` with the rows between each pair of table markers replaced; ValueError when a pair is not there once.

    The rows may be empty (a README whose tables were never filled): the pattern needs no line between the markers.
    """
    for name, table in (("config", config_table()), ("metrics", metric_table())):
        text, found = re.subn(rf"(<!-- {name}-table -->\n)(?:.*?\n)?(<!-- /{name}-table -->)",
                              lambda m, t=table: m.group(1) + t + "\n" + m.group(2), text, flags=re.S)
        if found != 1:
            raise ValueError(f"README.md needs one '<!-- {name}-table -->' ... '<!-- /{name}-table -->' pair, "
                             f"found {found}")
    return text


def main() -> int:
    readme = REPO / "README.md"
    current = readme.read_text()
    fresh = render(current)
    if "--check" in sys.argv:
        if fresh != current:
            print("README.md tables are out of date: run scripts/gen_readme_tables.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
