# SPDX-License-Identifier: Apache-2.0
"""Grafana Pyroscope's OTLP ingestion rules (research/formats.md section 3.1), as a checker for tests.

Mirrors pkg/ingester/otlp/convert.go and the distributor's validation: the profile key and the ``__name__`` it
maps to, index ranges, one value per sample when a period is set, the mapping every location resolves, service
naming from plain ``KeyValue`` resource attributes, and the default limits.
"""

from __future__ import annotations

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest

MAX_LABEL_NAMES = 30
MAX_SAMPLES = 16000
MAX_PROFILE_BYTES = 4 * 1024 * 1024


def profile_type_ids(request: ExportProfilesServiceRequest) -> list[str]:
    """Every profile's Pyroscope type id (``__name__:type:unit:period_type:period_unit``); raises on a rule broken."""
    problems = violations(request)
    if problems:
        raise AssertionError("Pyroscope would reject this request:\n" + "\n".join(problems))
    strings = request.dictionary.string_table
    out = []
    for resource_profiles in request.resource_profiles:
        for scope_profiles in resource_profiles.scope_profiles:
            for profile in scope_profiles.profiles:
                out.append(_type_id(profile, strings))
    return out


def _type_id(profile, strings) -> str:  # type: ignore[no-untyped-def]
    sample_type = strings[profile.sample_type.type_strindex]
    sample_unit = strings[profile.sample_type.unit_strindex]
    has_period = profile.HasField("period_type") and profile.period != 0
    period_type = strings[profile.period_type.type_strindex] if has_period else ""
    period_unit = strings[profile.period_type.unit_strindex] if has_period else ""
    key = f"{sample_type}:{sample_unit}:{period_type}:{period_unit}"
    if key == "samples:count:cpu:nanoseconds":
        return "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
    if key == "off_cpu:nanoseconds::":
        return "off_cpu:off_cpu:nanoseconds::"
    return f"{period_type}:{key}"


def violations(request: ExportProfilesServiceRequest) -> list[str]:
    d = request.dictionary
    problems: list[str] = []
    if not request.HasField("dictionary"):
        return ["missing dictionary (InvalidArgument)"]
    tables = {"string_table": d.string_table, "mapping_table": d.mapping_table, "location_table": d.location_table,
              "function_table": d.function_table, "link_table": d.link_table, "attribute_table": d.attribute_table,
              "stack_table": d.stack_table}
    for name, table in tables.items():
        if not len(table):
            problems.append(f"{name} is empty (needs its zero entry)")
        elif name == "string_table":
            if table[0] != "":
                problems.append("string_table[0] is not ''")
        elif table[0].ByteSize() != 0:
            problems.append(f"{name}[0] is not the zero value")

    def check_index(where: str, index: int, table: str) -> None:
        if not 0 <= index < len(tables[table]):
            problems.append(f"{where}: index {index} out of range of {table} ({len(tables[table])})")

    for i, kv in enumerate(d.attribute_table):
        check_index(f"attribute {i} key", kv.key_strindex, "string_table")
        if kv.value.HasField("string_value_strindex"):
            problems.append(f"attribute {i} uses string_value_strindex")
    for i, mapping in enumerate(d.mapping_table):
        check_index(f"mapping {i} filename", mapping.filename_strindex, "string_table")
        for a in mapping.attribute_indices:
            check_index(f"mapping {i} attribute", a, "attribute_table")
    for i, function in enumerate(d.function_table):
        for field in ("name_strindex", "system_name_strindex", "filename_strindex"):
            check_index(f"function {i} {field}", getattr(function, field), "string_table")
    for i, location in enumerate(d.location_table):
        check_index(f"location {i} mapping", location.mapping_index, "mapping_table")
        for line in location.lines:
            check_index(f"location {i} function", line.function_index, "function_table")
        for a in location.attribute_indices:
            check_index(f"location {i} attribute", a, "attribute_table")
    for i, stack in enumerate(d.stack_table):
        for loc in stack.location_indices:
            check_index(f"stack {i}", loc, "location_table")
    for i, link in enumerate(d.link_table[1:], start=1):
        if len(link.trace_id) != 16 or len(link.span_id) != 8:
            problems.append(f"link {i}: trace_id must be 16 bytes and span_id 8")

    for r, resource_profiles in enumerate(request.resource_profiles):
        attributes = resource_profiles.resource.attributes
        names = set()
        for kv in attributes:
            if not kv.key:
                problems.append(f"resource {r}: attribute without a plain key (key_strindex is not read)")
            if kv.value.HasField("string_value_strindex"):
                problems.append(f"resource {r}: {kv.key} uses string_value_strindex")
            names.add(kv.key)
        service = next((kv.value.string_value for kv in attributes if kv.key == "service.name"), "")
        if not service:
            problems.append(f"resource {r}: no service.name (would be filed as unknown_service)")
        if len(names) + 3 > MAX_LABEL_NAMES:
            problems.append(f"resource {r}: too many label names")
        for scope_profiles in resource_profiles.scope_profiles:
            for p, profile in enumerate(scope_profiles.profiles):
                where = f"resource {r} profile {p}"
                if not d.string_table[profile.period_type.type_strindex] or profile.period == 0:
                    problems.append(f"{where}: no period type/period: __name__ would be empty")
                if len(profile.samples) > MAX_SAMPLES:
                    problems.append(f"{where}: {len(profile.samples)} samples > {MAX_SAMPLES}")
                for a in profile.attribute_indices:
                    check_index(f"{where} attribute", a, "attribute_table")
                for s, sample in enumerate(profile.samples):
                    check_index(f"{where} sample {s} stack", sample.stack_index, "stack_table")
                    check_index(f"{where} sample {s} link", sample.link_index, "link_table")
                    for a in sample.attribute_indices:
                        check_index(f"{where} sample {s} attribute", a, "attribute_table")
                    if len(sample.values) == 0 and len(sample.timestamps_unix_nano) == 0:
                        problems.append(f"{where} sample {s}: no value and no timestamps")
                    if len(sample.values) > 1:
                        problems.append(f"{where} sample {s}: sample values length mismatch (one value per sample)")
    if request.ByteSize() > MAX_PROFILE_BYTES:
        problems.append(f"request is {request.ByteSize()} bytes > {MAX_PROFILE_BYTES}")
    return problems
