# SPDX-License-Identifier: Apache-2.0
"""Pure OTLP profiles encoder: :class:`ProfileBatch` -> ``ExportProfilesServiceRequest``.

The layout is opentelemetry-proto >= 1.43 (OTLP v1.10 wire: ``opentelemetry.proto.profiles.v1development``) as
Grafana Pyroscope >= 1.20 and the Collector >= 0.148 read it:

- one shared ``ProfilesDictionary``; each of its seven tables starts with its zero entry, so index 0 means "unset";
- one ``ResourceProfiles`` per process with plain ``KeyValue`` resource attributes (``process.pid``,
  ``process.executable.name``/``.path``, ``container.id``, ``k8s.pod.uid``, ``service.name``), then the node's
  (``host.name``, ``k8s.node.name``, ...: :attr:`ProfileBatch.node`), so two nodes' pid 1 stay apart;
- one ``Profile`` per process: one ``sample_type``, ``period_type``/``period``, time and duration, the batch's
  sampling fraction and attributes, then the process's own (:attr:`ProcessProfile.attributes`: the GPU time not
  measured, ``otel_gpu.gpu_time.yielded``), as profile attributes;
- one aggregated value per sample; sample attributes ``thread.id``, ``thread.name`` and :attr:`Sample.attributes`;
  trace links through the link table; location attribute ``profile.frame.type``; mapping attribute
  ``process.executable.build_id.gnu``.
"""

from __future__ import annotations

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_gpu import __version__, semconv
from otel_gpu.procfs import ProcessInfo, identity_attributes
from otel_gpu.profiles.model import Frame, Mapping, ProcessProfile, ProfileBatch, Sample

SCOPE_NAME = "otel-gpu"

AttributeValue = str | int | float | bool


def encode_otlp(batch: ProfileBatch) -> ExportProfilesServiceRequest:
    """The batch as one request: a resource (and profile) per process, one shared dictionary."""
    builder = _DictionaryBuilder()
    request = ExportProfilesServiceRequest()
    profile_attributes = [builder.attribute(semconv.OTEL_GPU_SAMPLING_FRACTION, float(batch.sampling_fraction))]
    profile_attributes += [builder.attribute(key, value) for key, value in batch.attributes]
    for process in batch.processes:
        resource_profiles = request.resource_profiles.add()
        resource_profiles.resource.CopyFrom(process_resource(process.process, batch.node))
        scope_profiles = resource_profiles.scope_profiles.add()
        scope_profiles.scope.CopyFrom(InstrumentationScope(name=SCOPE_NAME, version=__version__))
        _fill_profile(scope_profiles.profiles.add(), batch, process, builder, profile_attributes)
    builder.write(request.dictionary)
    return request


def process_resource(info: ProcessInfo, node: tuple[tuple[str, str], ...] = ()) -> Resource:
    """The process's resource, then the node's attributes (a process's own key wins): plain ``KeyValue`` keys and
    ``string_value``/``int_value`` (what Pyroscope reads); ``process.command_args`` (resource only: it is no metric
    or pprof label) as an ``array_value`` of strings."""
    pairs: list[tuple[str, AttributeValue | tuple[str, ...]]] = [
        *identity_attributes(info), (semconv.PROCESS_EXECUTABLE_PATH, info.executable_path),
        (semconv.PROCESS_COMMAND_ARGS, info.command_args)]
    own = {key for key, value in pairs if value not in ("", ())}
    pairs += [(key, value) for key, value in node if key not in own]
    return Resource(attributes=[KeyValue(key=key, value=any_value(value)) for key, value in pairs
                                if value not in ("", ())])


def any_value(value: AttributeValue | tuple[str, ...]) -> AnyValue:
    """``value`` as an ``AnyValue`` (bool, int, float, string or an array of strings; never the string-table
    variant)."""
    if isinstance(value, tuple):
        return AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=item) for item in value]))
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def _fill_profile(profile: pb.Profile, batch: ProfileBatch, process: ProcessProfile, builder: _DictionaryBuilder,
                  profile_attributes: list[int]) -> None:
    kind = batch.type
    profile.sample_type.type_strindex = builder.string(kind.sample_type)
    profile.sample_type.unit_strindex = builder.string(kind.sample_unit)
    if kind.period_type:
        profile.period_type.type_strindex = builder.string(kind.period_type)
        profile.period_type.unit_strindex = builder.string(kind.period_unit)
        profile.period = kind.period
    profile.time_unix_nano = batch.start_unix_nano
    profile.duration_nano = batch.duration_nano
    profile.attribute_indices.extend(profile_attributes)
    profile.attribute_indices.extend(builder.attribute(key, value) for key, value in process.attributes)
    for sample in process.samples:
        _add_sample(profile.samples.add(), sample, builder)


def _add_sample(out: pb.Sample, sample: Sample, builder: _DictionaryBuilder) -> None:
    out.stack_index = builder.stack(sample.frames)
    out.values.append(sample.value)
    attributes = []
    if sample.thread_id:
        attributes.append(builder.attribute(semconv.THREAD_ID, sample.thread_id))
    if sample.thread_name:
        attributes.append(builder.attribute(semconv.THREAD_NAME, sample.thread_name))
    attributes += [builder.attribute(key, value) for key, value in sample.attributes]
    out.attribute_indices.extend(attributes)
    if sample.trace_id or sample.span_id:
        out.link_index = builder.link(sample.trace_id, sample.span_id)


class _DictionaryBuilder:
    """Deduplicating tables of a ``ProfilesDictionary``; every table's entry 0 is the zero value."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {"": 0}
        self.attributes: dict[tuple[str, str, str], int] = {}
        self.attribute_table: list[pb.KeyValueAndUnit] = [pb.KeyValueAndUnit()]
        self.mappings: dict[Mapping, int] = {}
        self.mapping_table: list[pb.Mapping] = [pb.Mapping()]
        self.functions: dict[tuple[str, str, str], int] = {}
        self.function_table: list[pb.Function] = [pb.Function()]
        self.locations: dict[Frame, int] = {}
        self.locations_by_id: dict[int, int] = {}  # id(frame) -> index: the batch keeps its frames alive
        self.location_table: list[pb.Location] = [pb.Location()]
        self.stacks: dict[tuple[int, ...], int] = {}
        self.stacks_by_id: dict[int, int] = {}  # id(frames tuple) -> index: threads share stacks, the batch keeps them
        self.stack_table: list[pb.Stack] = [pb.Stack()]
        self.links: dict[tuple[bytes, bytes], int] = {}
        self.link_table: list[pb.Link] = [pb.Link()]

    def string(self, text: str) -> int:
        index = self.strings.get(text)
        if index is None:
            index = self.strings[text] = len(self.strings)
        return index

    def attribute(self, key: str, value: AttributeValue, unit: str = "") -> int:
        dedup_key = (key, unit, f"{type(value).__name__}:{value}")  # 1, 1.0 and True stay distinct
        index = self.attributes.get(dedup_key)
        if index is None:
            index = self.attributes[dedup_key] = len(self.attribute_table)
            self.attribute_table.append(pb.KeyValueAndUnit(
                key_strindex=self.string(key), value=any_value(value), unit_strindex=self.string(unit)))
        return index

    def mapping(self, mapping: Mapping | None) -> int:
        if mapping is None:
            return 0
        index = self.mappings.get(mapping)
        if index is None:
            index = self.mappings[mapping] = len(self.mapping_table)
            attributes = []
            if mapping.build_id:
                attributes.append(self.attribute(semconv.PROCESS_EXECUTABLE_BUILD_ID_GNU, mapping.build_id))
            self.mapping_table.append(pb.Mapping(
                memory_start=mapping.start, memory_limit=mapping.limit, file_offset=mapping.file_offset,
                filename_strindex=self.string(mapping.path), attribute_indices=attributes))
        return index

    def function(self, frame: Frame) -> int:
        key = (frame.function, frame.system_name or frame.function, frame.filename)
        index = self.functions.get(key)
        if index is None:
            index = self.functions[key] = len(self.function_table)
            self.function_table.append(pb.Function(
                name_strindex=self.string(key[0]), system_name_strindex=self.string(key[1]),
                filename_strindex=self.string(key[2])))
        return index

    def location(self, frame: Frame) -> int:
        index = self.locations_by_id.get(id(frame))
        if index is not None:
            return index
        index = self.locations.get(frame)
        if index is None:
            index = self.locations[frame] = len(self.location_table)
            self.location_table.append(pb.Location(
                mapping_index=self.mapping(frame.mapping), address=frame.address,
                lines=[pb.Line(function_index=self.function(frame), line=frame.line)],
                attribute_indices=[self.attribute(semconv.PROFILE_FRAME_TYPE, frame.kind.value)]))
        self.locations_by_id[id(frame)] = index
        return index

    def stack(self, frames: tuple[Frame, ...]) -> int:
        index = self.stacks_by_id.get(id(frames))
        if index is None:
            index = self.stacks_by_id[id(frames)] = self._stack(frames)
        return index

    def _stack(self, frames: tuple[Frame, ...]) -> int:
        by_id = self.locations_by_id
        key = tuple([by_id.get(id(frame)) or self.location(frame) for frame in frames])
        index = self.stacks.get(key)
        if index is None:
            index = self.stacks[key] = len(self.stack_table)
            self.stack_table.append(pb.Stack(location_indices=key))
        return index

    def link(self, trace_id: str, span_id: str) -> int:
        key = (_id_bytes(trace_id, 16), _id_bytes(span_id, 8))
        index = self.links.get(key)
        if index is None:
            index = self.links[key] = len(self.link_table)
            self.link_table.append(pb.Link(trace_id=key[0], span_id=key[1]))
        return index

    def write(self, dictionary: pb.ProfilesDictionary) -> None:
        dictionary.string_table.extend(self.strings)
        dictionary.attribute_table.extend(self.attribute_table)
        dictionary.mapping_table.extend(self.mapping_table)
        dictionary.function_table.extend(self.function_table)
        dictionary.location_table.extend(self.location_table)
        dictionary.stack_table.extend(self.stack_table)
        dictionary.link_table.extend(self.link_table)


def _id_bytes(hex_id: str, size: int) -> bytes:
    """A hex trace/span id as ``size`` bytes; malformed ids become all-zero (an invalid, ignorable id)."""
    try:
        raw = bytes.fromhex(hex_id)
    except ValueError:
        return bytes(size)
    return raw.rjust(size, b"\0")[-size:] if raw else bytes(size)
