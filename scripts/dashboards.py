# SPDX-License-Identifier: Apache-2.0
"""Grafana dashboards for otel-gpu, built with grafana-foundation-sdk and written to helm/otel-gpu/dashboards/.

    python scripts/dashboards.py            # (re)write the JSON files
    python scripts/dashboards.py --check    # exit 1 when a committed file differs from what this builds

Three dashboards on a Prometheus-compatible data source (Mimir, Prometheus, VictoriaMetrics) plus one Pyroscope
data source for the flame graphs. Metric names are the Prometheus translation of ``otel_gpu.semconv`` with unit
suffixes (``semconv.prometheus_name``), which all three dashboards expect and every path gives:

- the agent's ``--prometheus-port`` endpoint scraped by Prometheus (tests/dashboards/test_dashboards_prometheus.py);
- OTLP into VictoriaMetrics with ``-opentelemetry.usePrometheusNaming`` (tests/dashboards/test_dashboards.py);
- OTLP into Prometheus 3 (its default ``UnderscoreEscapingWithSuffixes``) or Mimir (with
  ``-distributor.otel-metric-suffixes-enabled=true``): the same translation rules (not run here).

Two names differ between them: hw.status and otel_gpu.source.up, up-down counters of unit 1, are ``hw_status`` and
``otel_gpu_source_up`` when scraped and through Prometheus' own translation (``_ratio`` only for gauges) but
``hw_status_ratio`` and ``otel_gpu_source_up_ratio`` in VictoriaMetrics, so their queries match
``__name__=~"hw_status(_ratio)?"`` and ``__name__=~"otel_gpu_source_up(_ratio)?"``.

Labels: ``k8s_cluster_name``, ``host_name`` (the node), ``hw_id`` (GPU UUID), ``k8s_namespace_name`` /
``k8s_pod_name``. Through the gateway Collector (collector-config/) all of them are on every series (its transform
copies the resource onto the data points; k8sattributes adds the pod names). Scraped, the resource is only in
``target_info``: the chart's ServiceMonitor / PodMonitor add ``host_name`` and ``k8s_cluster_name`` from the target,
and nothing adds pod and namespace names (the series carry ``k8s_pod_uid``), so those two variables list nothing.
Every filter variable has "All" = ``.*``, which also matches series without the label, so every panel still shows
data in that case and without the Collector.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import grafanapyroscope, prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

OUT_DIR = Path(__file__).resolve().parent.parent / "helm" / "otel-gpu" / "dashboards"

PROM = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
PYROSCOPE = dm.DataSourceRef(type_val="grafana-pyroscope-datasource", uid="${pyroscope}")

NODE = 'k8s_cluster_name=~"$cluster", host_name=~"$node"'
GPU = NODE + ', hw_id=~"$gpu"'
POD = NODE + ', k8s_namespace_name=~"$namespace", k8s_pod_name=~"$pod"'
POD_GPU = POD + ', hw_id=~"$gpu"'

# hw.status (an up-down counter of unit 1): Prometheus and Mimir name it hw_status, VictoriaMetrics hw_status_ratio
STATUS = '__name__=~"hw_status(_ratio)?"'
SOURCE_UP = '__name__=~"otel_gpu_source_up(_ratio)?"'  # otel_gpu.source.up: the same rule
# every GPU sends its memory size: the variables list GPUs, nodes and clusters from it
INVENTORY = "hw_gpu_memory_limit_bytes"

# Pyroscope profile type ids of what the agent sends (otel_gpu/profiles/model.py; Pyroscope's OTLP naming rule)
PROFILE_TYPES = {
    "CPU (on-CPU stacks, eBPF sampler)": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
    "GPU time (CUDA kernels, copies and sets by launching stack)": "gpu:gpu_time:nanoseconds:gpu:nanoseconds",
    "Sync wait (CPU threads blocked on the GPU)": "gpu_wait:sync_wait:nanoseconds:gpu_wait:nanoseconds",
}
# Profiles carry the process's resource: the agent gives the node (and the chart's clusterName), the gateway's
# k8sattributes adds namespace and pod names and its resource processor the cluster; Pyroscope files them with dots
# turned to underscores. No GPU filter: a CPU or sync-wait profile belongs to no one GPU.
PROFILE_SELECTOR = ('{k8s_cluster_name=~"$cluster", k8s_node_name=~"$node", k8s_namespace_name=~"$namespace", '
                    'k8s_pod_name=~"$pod"}')


# --- variables ------------------------------------------------------------------------------------------------------

def _label_values(name: str, label: str, metric: str, selector: str, text: str) -> db.QueryVariable:
    query = f"label_values({metric}{{{selector}}}, {label})" if selector else f"label_values({metric}, {label})"
    return (db.QueryVariable(name).label(text).datasource(PROM).query(query)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(selected=True, text="All", value="$__all")))


def variables(gpu: bool = True, pods: bool = True, profiles: bool = False) -> list[db.QueryVariable]:
    out = [
        db.DatasourceVariable("datasource").label("Metrics").type("prometheus"),
        _label_values("cluster", "k8s_cluster_name", INVENTORY, "", "Cluster"),
        _label_values("node", "host_name", INVENTORY, 'k8s_cluster_name=~"$cluster"', "Node"),
    ]
    if gpu:
        out.append(_label_values("gpu", "hw_id", INVENTORY, NODE, "GPU"))
    if pods:
        out.append(_label_values("namespace", "k8s_namespace_name", "nvidia_gpu_process_memory_usage_bytes", NODE,
                                 "Namespace"))
        out.append(_label_values("pod", "k8s_pod_name", "nvidia_gpu_process_memory_usage_bytes",
                                 NODE + ', k8s_namespace_name=~"$namespace"', "Pod"))
    if profiles:
        out.insert(1, db.DatasourceVariable("pyroscope").label("Profiles").type("grafana-pyroscope-datasource"))
    return out


# --- panels ---------------------------------------------------------------------------------------------------------

def q(expr: str, legend: str = "", instant: bool = False) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).datasource(PROM)
    if legend:
        query = query.legend_format(legend)
    return query.instant() if instant else query.range()


def series(title: str, unit: str, *queries: prometheus.Dataquery, description: str = "",
           max_val: float | None = None, stack: bool = False) -> timeseries.Panel:
    targets = [query.ref_id(chr(ord("A") + i)) for i, query in enumerate(queries)]
    panel = timeseries.Panel().title(title).unit(unit).datasource(PROM).targets(targets).min(0)
    if description:
        panel = panel.description(description)
    if max_val is not None:
        panel = panel.max(max_val)
    if stack:
        from grafana_foundation_sdk.builders import common as cb
        from grafana_foundation_sdk.models import common as cm
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(30)
    return panel


def number(title: str, query: prometheus.Dataquery, unit: str = "none", description: str = "") -> stat.Panel:
    panel = stat.Panel().title(title).unit(unit).datasource(PROM).with_target(query.ref_id("A"))
    return panel.description(description) if description else panel


def listing(title: str, query: prometheus.Dataquery, unit: str = "none", description: str = "") -> table.Panel:
    panel = table.Panel().title(title).unit(unit).datasource(PROM).with_target(
        query.format(pm.PromQueryFormat.TABLE).ref_id("A"))
    return panel.description(description) if description else panel


def flame_graph(title: str, profile_type_id: str) -> db.Panel:
    query = (grafanapyroscope.Dataquery().datasource(PYROSCOPE).profile_type_id(profile_type_id)
             .label_selector(PROFILE_SELECTOR).query_type("profile").group_by([]).ref_id("A"))
    return db.Panel().type("flamegraph").title(title).datasource(PYROSCOPE).options({}).with_target(query)


@dataclass
class Layout:
    """Places panels left to right in a 24-column grid, starting a new line when one does not fit."""

    x: int = 0
    y: int = 0
    line_h: int = 0

    def place(self, panel, w: int, h: int = 8):  # type: ignore[no-untyped-def]
        if self.x + w > 24:
            self.x, self.y, self.line_h = 0, self.y + self.line_h, 0
        panel = panel.grid_pos(dm.GridPos(h=h, w=w, x=self.x, y=self.y))
        self.x += w
        self.line_h = max(self.line_h, h)
        return panel

    def row(self, title: str) -> db.Row:
        if self.x:
            self.x, self.y, self.line_h = 0, self.y + self.line_h, 0
        out = db.Row(title).grid_pos(dm.GridPos(h=1, w=24, x=0, y=self.y))
        self.y += 1
        return out


def _build(uid: str, title: str, description: str, items: Iterable[tuple], tags: list[str],  # type: ignore[type-arg]
           **variable_kinds: bool) -> dict[str, object]:
    builder = (db.Dashboard(title).uid(uid).description(description).tags(["otel-gpu", "gpu", *tags])
               .refresh("30s").time("now-1h", "now").timezone("browser").editable()
               .link(db.DashboardLink("otel-gpu").type(dm.DashboardLinkType.DASHBOARDS).tags(["otel-gpu"])
                     .as_dropdown(True).include_vars(True).keep_time(True)))
    for variable in variables(**variable_kinds):
        builder = builder.with_variable(variable)
    layout = Layout()
    for panel_id, item in enumerate(items, start=1):  # Grafana wants an id, unique in the dashboard, on every panel
        if isinstance(item, str):
            builder = builder.with_row(layout.row(item).id(panel_id))
        else:
            panel, w, *h = item
            builder = builder.with_panel(layout.place(panel, w, *h).id(panel_id))
    return json.loads(json.dumps(builder.build(), cls=JSONEncoder))


# --- the three dashboards -------------------------------------------------------------------------------------------

IDLE_ALLOCATED = (
    f'avg_over_time(hw_gpu_utilization_ratio{{hw_gpu_task="general", {GPU}}}[5m]) < 0.05 '
    f'and on (hw_id) (count by (hw_id) (nvidia_gpu_process_memory_usage_bytes{{{GPU}}}) > 0)')


def fleet() -> dict[str, object]:
    items = [
        "GPUs",
        (number("GPUs", q(f"count(hw_gpu_memory_limit_bytes{{{GPU}}})", instant=True),
                description="GPUs reporting, on the selected nodes"), 4, 5),
        (number("GPUs by state", q(f"sum by (hw_state) ({{{STATUS}, {GPU}}})", "{{hw_state}}", instant=True),
                description="hw.status: 1 per GPU in its current hw.state (ok, failed)"), 6, 5),
        (number("Idle but allocated", q(f"count({IDLE_ALLOCATED}) or vector(0)", instant=True),
                description="GPUs with processes holding memory but under 5 % utilization over 5 minutes"), 4, 5),
        (number("Fleet utilization", q(f'avg(hw_gpu_utilization_ratio{{hw_gpu_task="general", {GPU}}})',
                                       instant=True), "percentunit"), 5, 5),
        (number("Power", q(f"sum(hw_power_watts{{{GPU}}})", instant=True), "watt"), 5, 5),
        (listing("Idle but allocated GPUs",
                 q(f"max by (host_name, hw_id, nvidia_gpu_index) ({IDLE_ALLOCATED})", instant=True), "percentunit",
                 "Average utilization over 5 minutes of GPUs that have processes but do (almost) nothing"), 24, 6),
        "By node",
        (series("GPU utilization by node", "percentunit",
                q(f'avg by (host_name) (hw_gpu_utilization_ratio{{hw_gpu_task="general", {GPU}}})', "{{host_name}}"),
                max_val=1), 12),
        (series("GPU memory used by node", "percentunit",
                q(f"sum by (host_name) (hw_gpu_memory_usage_bytes{{{GPU}}}) / "
                  f"sum by (host_name) (hw_gpu_memory_limit_bytes{{{GPU}}})", "{{host_name}}"), max_val=1), 12),
        (series("Power by node", "watt", q(f"sum by (host_name) (hw_power_watts{{{GPU}}})", "{{host_name}}")), 12),
        (listing("GPUs", q(f'max by (host_name, nvidia_gpu_index, hw_id, hw_model) '
                           f'(hw_gpu_utilization_ratio{{hw_gpu_task="general", {GPU}}})', instant=True),
                 "percentunit", "Utilization of every selected GPU"), 12),
        "By namespace and pod",
        (series("GPU memory by namespace", "bytes",
                q(f"sum by (k8s_namespace_name) (nvidia_gpu_process_memory_usage_bytes{{{POD_GPU}}})",
                  "{{k8s_namespace_name}}"), stack=True), 12),
        (series("SM share by namespace", "percentunit",
                q(f"sum by (k8s_namespace_name) (nvidia_gpu_process_sm_utilization_ratio{{{POD_GPU}}})",
                  "{{k8s_namespace_name}}"), stack=True,
                description="Sum over GPUs of the time share the namespace's processes had kernels on the SMs "
                            "(1 = one GPU's worth)"), 12),
        (series("GPU memory by pod", "bytes",
                q(f"sum by (k8s_namespace_name, k8s_pod_name) (nvidia_gpu_process_memory_usage_bytes{{{POD_GPU}}})",
                  "{{k8s_namespace_name}}/{{k8s_pod_name}}"), stack=True), 12),
        (series("SM share by pod", "percentunit",
                q(f"sum by (k8s_namespace_name, k8s_pod_name) "
                  f"(nvidia_gpu_process_sm_utilization_ratio{{{POD_GPU}}})",
                  "{{k8s_namespace_name}}/{{k8s_pod_name}}"), stack=True), 12),
        "Agent health",
        (series("Sources running", "none",
                q(f"sum by (otel_gpu_source) ({{{SOURCE_UP}, {NODE}}})", "{{otel_gpu_source}}"),
                description="Agents on which each source runs (otel_gpu.source.up); a source is off where the "
                            "configuration turns it off or it could not start (the agent's log says why)"), 8),
        (series("Collection duration", "s",
                q(f"max by (host_name, otel_gpu_source) (otel_gpu_collection_duration_seconds{{{NODE}}})",
                  "{{host_name}} {{otel_gpu_source}}"),
                description="Wall time of each source's last collection (for NVML, the slowest GPU)"), 8),
        (series("CPU samples", "ops",
                q(f"sum by (host_name) (rate(otel_gpu_profiling_samples_total{{{NODE}}}[$__rate_interval]))",
                  "{{host_name}}"),
                description="CPU stack samples per second taken by each agent's eBPF sampler"), 8),
        (series("Dropped", "short",
                q(f"sum by (otel_gpu_signal, otel_gpu_reason) "
                  f"(increase(otel_gpu_dropped_total{{{NODE}}}[$__rate_interval]))",
                  "{{otel_gpu_signal}} {{otel_gpu_reason}}"),
                description="Data the agents had to drop per interval, by signal and reason (queue_full: a "
                            "backend was down longer than the retry queue holds; README.md lists the reasons)"), 8),
        (series("Export failures", "short",
                q(f"sum by (otel_gpu_exporter, otel_gpu_signal) "
                  f"(increase(otel_gpu_export_failures_total{{{NODE}}}[$__rate_interval]))",
                  "{{otel_gpu_exporter}} {{otel_gpu_signal}}"),
                description="Failed export attempts per interval, by exporter and signal (retried ones count too)"),
         8),
        (series("Source errors", "short",
                q(f"sum by (otel_gpu_source, otel_gpu_reason) "
                  f"(increase(otel_gpu_source_errors_total{{{NODE}}}[$__rate_interval]))",
                  "{{otel_gpu_source}} {{otel_gpu_reason}}"),
                description="Errors reading a source per interval, by source and reason"), 8),
    ]
    return _build("otel-gpu-fleet", "otel-gpu / Fleet", "GPUs across clusters and nodes: state, idle-but-allocated "
                  "GPUs, utilization and memory by node, namespace and pod, and the agents' own health", items,
                  ["fleet"])


def gpu() -> dict[str, object]:
    items = [
        "Utilization",
        (series("Utilization", "percentunit", q(f"hw_gpu_utilization_ratio{{{GPU}}}", "{{hw_id}} {{hw_gpu_task}}"),
                max_val=1, description="Fraction of time a kernel (or the encoder / decoder) ran"), 12),
        (series("Hopper activities (GPM)", "percentunit",
                q(f"nvidia_gpu_sm_activity_ratio{{{GPU}}}", "{{hw_id}} SM activity"),
                q(f"nvidia_gpu_sm_occupancy_ratio{{{GPU}}}", "{{hw_id}} SM occupancy"),
                q(f"nvidia_gpu_tensor_activity_ratio{{{GPU}}}", "{{hw_id}} tensor activity"),
                q(f"nvidia_gpu_dram_activity_ratio{{{GPU}}}", "{{hw_id}} DRAM activity"),
                q(f"nvidia_gpu_memory_bandwidth_utilization_ratio{{{GPU}}}", "{{hw_id}} memory controller busy"),
                max_val=1, description="GPM metrics (Hopper and later): how much of the GPU the work really uses"), 12),
        "Memory and power",
        (series("Memory", "bytes", q(f"hw_gpu_memory_usage_bytes{{{GPU}}}", "{{hw_id}} used"),
                q(f"hw_gpu_memory_limit_bytes{{{GPU}}}", "{{hw_id}} total")), 8),
        (series("Power against limit", "watt", q(f"hw_power_watts{{{GPU}}}", "{{hw_id}} power"),
                q(f"nvidia_gpu_power_limit_watts{{{GPU}}}", "{{hw_id}} enforced limit")), 8),
        (series("Energy rate", "watt", q(f"rate(hw_energy_joules_total{{{GPU}}}[$__rate_interval])", "{{hw_id}}"),
                description="Power from the energy counter (averaged over the interval)"), 8),
        "Thermals and clocks",
        (series("Temperature against thresholds", "celsius",
                q(f"hw_temperature_celsius{{{GPU}}}", "{{hw_id}}"),
                q(f"hw_temperature_limit_celsius{{{GPU}}}", "{{hw_id}} {{hw_limit_type}}"),
                description="high.degraded = slowdown threshold, high.critical = shutdown threshold"), 8),
        (series("Clocks", "hertz",
                q(f"nvidia_gpu_clock_frequency_hertz{{{GPU}}}", "{{hw_id}} {{nvidia_gpu_clock_type}}"),
                q(f"nvidia_gpu_clock_frequency_limit_hertz{{{GPU}}}", "{{hw_id}} {{nvidia_gpu_clock_type}} max")), 8),
        (series("Performance state", "none", q(f"nvidia_gpu_performance_state{{{GPU}}}", "{{hw_id}}"),
                description="P0 (highest) to P15 (lowest)"), 8),
        (statetimeline.Panel().title("Throttle reasons").datasource(PROM)
         .description("1 while the clocks are held back for the reason").with_target(
             q(f"nvidia_gpu_clock_throttle{{{GPU}}}", "{{hw_id}} {{nvidia_gpu_throttle_reason}}").ref_id("A")),
         24, 10),
        "PCIe and errors",
        (series("PCIe throughput", "Bps",
                q(f"rate(hw_gpu_io_bytes_total{{{GPU}}}[$__rate_interval])", "{{hw_id}} {{network_io_direction}}")),
         8),
        (series("Errors", "short",
                q(f'increase(hw_errors_total{{error_type!="xid", {GPU}}}[$__rate_interval])',
                  "{{hw_id}} {{error_type}}"),
                description="ECC corrected / uncorrected and PCIe replay errors per interval"), 8),
        (series("XID errors", "short",
                q(f'increase(hw_errors_total{{error_type="xid", {GPU}}}[$__rate_interval])',
                  "{{hw_id}} XID {{nvidia_gpu_xid_code}}")), 8),
        (listing("XID errors seen", q(f"nvidia_gpu_xid_last_time_seconds{{{GPU}}} * 1000", instant=True),
                 "dateTimeAsIso",
                 "Last time of each XID code per GPU (counts are in the XID errors panel)"), 12),
        (listing("GPU state", q(f"{{{STATUS}, {GPU}}} == 1", instant=True),
                 description="The current hw.state of each GPU"), 12),
        "NVLink",
        (series("NVLink throughput", "Bps",
                q(f"sum by (hw_id, network_io_direction) "
                  f"(rate(nvidia_gpu_nvlink_io_bytes_total{{{GPU}}}[$__rate_interval]))",
                  "{{hw_id}} {{network_io_direction}}"),
                description="Data bytes per second over all of each GPU's active links (no series without NVLink)"),
         12),
        (series("NVLink errors", "short",
                q(f"sum by (hw_id, error_type) (increase(nvidia_gpu_nvlink_errors_total{{{GPU}}}[$__rate_interval]))",
                  "{{hw_id}} {{error_type}}"),
                description="Data-link errors per interval over all of each GPU's links: replay, recovery, "
                            "crc_flit, crc_data"), 12),
        "Processes",
        (listing("Processes on the GPU",
                 q(f"sum by (hw_id, process_pid, process_executable_name, k8s_namespace_name, k8s_pod_name, "
                   f"k8s_pod_uid) (nvidia_gpu_process_memory_usage_bytes{{{GPU}}})", instant=True), "bytes",
                 "GPU memory held by each process (namespace and pod names come from the gateway Collector; "
                 "scraped, only the pod uid is there)"), 24),
    ]
    return _build("otel-gpu-gpu", "otel-gpu / GPU", "One GPU in detail: utilization and Hopper activities, memory, "
                  "power, temperature, clocks, throttle reasons, PCIe, XIDs and errors, NVLink", items, ["gpu-detail"],
                  pods=False)


def workloads() -> dict[str, object]:
    by = "k8s_namespace_name, k8s_pod_name, process_pid, process_executable_name"
    legend = "{{k8s_namespace_name}}/{{k8s_pod_name}} {{process_executable_name}} ({{process_pid}})"
    items = [
        "GPU usage (NVML)",
        (series("GPU memory", "bytes", q(f"sum by ({by}) (nvidia_gpu_process_memory_usage_bytes{{{POD_GPU}}})",
                                         legend), stack=True), 12),
        (series("SM share", "percentunit", q(f"sum by ({by}) (nvidia_gpu_process_sm_utilization_ratio{{{POD_GPU}}})",
                                             legend), stack=True,
                description="Fraction of time the process had kernels on the SMs, summed over its GPUs"), 12),
        "GPU time (CUDA injection)",
        (series("Kernel time", "percentunit",
                q(f"sum by ({by}) (rate(nvidia_gpu_process_kernel_time_seconds_total{{{POD}}}[$__rate_interval]))",
                  legend), stack=True,
                description="GPU seconds per second of kernels, copies and sets (estimated from sampled windows, "
                            "not over the time in 'GPU time not measured')"), 6),
        (series("GPU time sampled / not measured", "percentunit",
                q(f"sum by ({by}) (rate(otel_gpu_gpu_time_sampled_seconds_total{{{POD}}}[$__rate_interval]))",
                  "sampled: " + legend),
                q(f"sum by ({by}) (rate(otel_gpu_gpu_time_yielded_seconds_total{{{POD}}}[$__rate_interval]))",
                  "not measured: " + legend),
                description="Sampled: the fraction of the process's time its sampling windows covered "
                            "(otel_gpu.gpu_time.sampled; the overhead budget sizes it, and the fewer windows, the "
                            "wider the estimates' spread). Not measured: seconds per second the injected library "
                            "stood aside for another CUPTI user (torch.profiler, ...) or for the program's CUDA "
                            "graphs (otel_gpu.gpu_time.yielded); kernel time and the GPU-time flame graph leave "
                            "that time out"), 6),
        (series("Launches", "ops",
                q(f"sum by ({by}) (rate(nvidia_gpu_process_kernel_launches_total{{{POD}}}[$__rate_interval]))",
                  legend)), 6),
        (series("Sync-wait time", "percentunit",
                q(f"sum by ({by}) (rate(nvidia_gpu_process_sync_wait_time_seconds_total{{{POD}}}[$__rate_interval]))",
                  legend),
                description="Seconds per second the process's threads were blocked waiting on the GPU"), 6),
        "Flame graphs (Pyroscope)",
        *((flame_graph(title, type_id), 24, 14) for title, type_id in PROFILE_TYPES.items()),
    ]
    return _build("otel-gpu-workloads", "otel-gpu / Processes and pods", "GPU memory, SM share, kernel time, "
                  "launches and sync-wait time per process and pod, with CPU, GPU-time and sync-wait flame graphs",
                  items, ["workloads", "profiles"], profiles=True)


DASHBOARDS = {"otel-gpu-fleet.json": fleet, "otel-gpu-gpu.json": gpu, "otel-gpu-workloads.json": workloads}


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {name: json.dumps(build(), indent=2, sort_keys=True) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale (run python scripts/dashboards.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
