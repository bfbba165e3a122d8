# SPDX-License-Identifier: Apache-2.0
"""Pure pprof encoder: :class:`ProfileBatch` -> gzipped ``perftools.profiles.Profile`` bytes.

The wire format is written by hand (a few varint and length-delimited fields), so no pprof ``.proto`` has to be
compiled. Field numbers follow github.com/google/pprof/proto/profile.proto. Mappings, locations, functions and
strings are deduplicated; every id is non-zero and ``string_table[0]`` is "".

Sample types: a ``samples/count`` batch (CPU) gets ``samples/count`` and ``<period_type>/<period_unit>``
(= count x period, e.g. ``cpu/nanoseconds``); any other batch gets its own type (e.g. ``gpu_time/nanoseconds``).
Labels: ``pid`` and ``thread_id`` (numbers), ``thread_name`` and the process's identity as on its OTLP resource with
``_`` for ``.`` (``service_name``, ``process_executable_name``, ``container_id``, ``k8s_pod_uid``, the k8s names)
and ``rank`` (its ``distributed.rank``) (strings), ``trace_id``/``span_id`` (strings, as Pyroscope reads them), the
node's ``host_name`` and ``k8s_node_name`` (strings, from :attr:`ProfileBatch.node`; a pprof file has no resource,
and Pyroscope's /ingest keeps str labels as series labels) and every :attr:`Sample.attributes` pair (int -> num
label, str -> str label). Comments state the sampling fraction and each process's profile attributes (the GPU time
not measured); the main executable's mapping comes first.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable

from otel_gpu import semconv
from otel_gpu.procfs import ProcessInfo, identity_attributes
from otel_gpu.profiles.model import Frame, FrameKind, Mapping, ProcessProfile, ProfileBatch, Sample

# perftools.profiles.Profile field numbers
_P_SAMPLE_TYPE, _P_SAMPLE, _P_MAPPING, _P_LOCATION, _P_FUNCTION, _P_STRING = 1, 2, 3, 4, 5, 6
_NODE_LABELS = (semconv.HOST_NAME, semconv.K8S_NODE_NAME)  # not all of the node's attributes: Pyroscope allows 30
_P_TIME_NANOS, _P_DURATION_NANOS, _P_PERIOD_TYPE, _P_PERIOD, _P_COMMENT, _P_DEFAULT_SAMPLE_TYPE = 9, 10, 11, 12, 13, 14


def encode_pprof(batch: ProfileBatch, compress_level: int = 6) -> bytes:
    """The whole batch (every process) as one gzipped pprof profile."""
    return gzip.compress(encode_pprof_raw(batch), compresslevel=compress_level, mtime=0)


def encode_pprof_raw(batch: ProfileBatch) -> bytes:
    """The batch as an uncompressed serialized pprof ``Profile`` (what :func:`encode_pprof` gzips)."""
    return _PprofBuilder(batch).build()


def sample_types(batch: ProfileBatch) -> list[tuple[str, str]]:
    """The (type, unit) pairs of every value of a pprof sample for ``batch``, in order."""
    kind = batch.type
    if _is_count(batch):
        return [(kind.sample_type, kind.sample_unit), (kind.period_type, kind.period_unit)]
    return [(kind.sample_type, kind.sample_unit)]


def comments(batch: ProfileBatch) -> list[str]:
    """What the profile states beside its samples (``go tool pprof -comments``): the sampling fraction of an
    estimate, and the seconds each process's GPU time was not measured."""
    out = []
    if batch.sampling_fraction < 1.0 and batch.sample_count:
        out.append(f"{semconv.OTEL_GPU_SAMPLING_FRACTION}={batch.sampling_fraction:.6g}: values re-weighted from the "
                   f"{batch.sampling_fraction * 100:.3g}% of the time sampled")
    for process in batch.processes:
        for key, value in process.attributes:
            if key == semconv.OTEL_GPU_GPU_TIME_YIELDED:
                name = process.process.service_name or process.process.executable_name
                out.append(f"{key}={float(value):.3f} s in pid {process.process.pid} ({name}): GPU time not "
                           "measured (another tool such as torch.profiler held CUPTI, or the library stood aside "
                           "for the program's CUDA graphs)")
            else:
                out.append(f"{key}={value} in pid {process.process.pid}")
    return out


def _is_count(batch: ProfileBatch) -> bool:
    kind = batch.type
    return kind.sample_unit == "count" and bool(kind.period_type) and kind.period > 0


def varint_bytes(value: int) -> bytes:
    """``value`` as a protobuf varint (negative numbers as 64-bit two's complement, as int64 fields want)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Writer:
    """Append-only protobuf wire writer."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def varint(self, value: int) -> None:
        if 0 <= value < 0x80:
            self.buf.append(value)
        else:
            self.buf += varint_bytes(value)

    def uint(self, field: int, value: int) -> None:
        """A varint field (int64/uint64/bool); zero is the default and is left out."""
        if value:
            self.varint(field << 3)
            self.varint(value)

    def data(self, field: int, payload: bytes | bytearray) -> None:
        self.varint((field << 3) | 2)
        self.varint(len(payload))
        self.buf += payload

    def packed(self, field: int, values: Iterable[int]) -> None:
        inner = _Writer()
        for value in values:
            inner.varint(value)
        if inner.buf:
            self.data(field, inner.buf)


class _PprofBuilder:
    def __init__(self, batch: ProfileBatch) -> None:
        self.batch = batch
        self.strings: dict[str, int] = {"": 0}
        self.mappings: dict[Mapping, int] = {}
        self.functions: dict[tuple[str, str, str], int] = {}
        self.locations: dict[Frame, int] = {}
        self.location_varints: dict[int, bytes] = {}  # id(frame) -> varint of its location id (frames outlive us)
        self.stack_ids: dict[int, bytes] = {}  # id(frames tuple) -> its location ids (threads share stacks)
        self.labels: dict[tuple[str, str, int], bytes] = {}  # (key, text, num) -> encoded label field
        self.identity: dict[int, bytes] = {}  # id(ProcessInfo) -> its encoded identity labels (the batch holds it)
        self.out = _Writer()
        self.locations_out = _Writer()
        self.functions_out = _Writer()
        self.node_labels = b"".join(self._label(key.replace(".", "_"), text=value) for key, value in batch.node
                                    if key in _NODE_LABELS and value)

    def s(self, text: str) -> int:
        index = self.strings.get(text)
        if index is None:
            index = self.strings[text] = len(self.strings)
        return index

    def build(self) -> bytes:
        batch, out = self.batch, self.out
        types = sample_types(batch)
        for type_name, unit in types:
            out.data(_P_SAMPLE_TYPE, self._value_type(type_name, unit))
        for process in batch.processes:
            for sample in process.samples:
                out.data(_P_SAMPLE, self._sample(process, sample, len(types)))
        mappings = _Writer()
        # the main executable's mapping first: readers name the profile after mapping[0] (`File:` in pprof -top);
        # ids stay as the locations have them
        executables = {p.process.executable_path for p in batch.processes if p.process.executable_path}
        for mapping, mapping_id in sorted(self.mappings.items(), key=lambda item: item[0].path not in executables):
            mappings.data(_P_MAPPING, self._mapping(mapping, mapping_id))
        out.buf += mappings.buf + self.locations_out.buf + self.functions_out.buf
        out.uint(_P_TIME_NANOS, batch.start_unix_nano)
        out.uint(_P_DURATION_NANOS, batch.duration_nano)
        if batch.type.period_type:
            out.data(_P_PERIOD_TYPE, self._value_type(batch.type.period_type, batch.type.period_unit))
        out.uint(_P_PERIOD, batch.type.period)
        out.packed(_P_COMMENT, [self.s(text) for text in comments(batch)])
        out.uint(_P_DEFAULT_SAMPLE_TYPE, self.s(types[-1][0]))
        # the string table goes last: every index is known by now
        strings = _Writer()
        for text in self.strings:
            strings.data(_P_STRING, text.encode("utf-8", "replace"))
        return bytes(out.buf + strings.buf)

    def _value_type(self, type_name: str, unit: str) -> bytearray:
        w = _Writer()
        w.uint(1, self.s(type_name))
        w.uint(2, self.s(unit))
        return w.buf

    def _sample(self, process: ProcessProfile, sample: Sample, n_values: int) -> bytearray:
        w = _Writer()
        ids = self.stack_ids.get(id(sample.frames))
        if ids is None:
            cache = self.location_varints
            ids = self.stack_ids[id(sample.frames)] = b"".join([cache.get(id(frame)) or self._location(frame)
                                                                for frame in sample.frames])
        if ids:
            w.data(1, ids)
        values = [sample.value]
        if n_values == 2:
            values.append(sample.value * self.batch.type.period)
        w.packed(2, values)
        info = process.process
        w.buf += self._label(semconv.PPROF_LABEL_PID, num=info.pid)
        if sample.thread_id:
            w.buf += self._label(semconv.PPROF_LABEL_THREAD_ID, num=sample.thread_id)
        if sample.thread_name:
            w.buf += self._label(semconv.PPROF_LABEL_THREAD_NAME, text=sample.thread_name)
        w.buf += self._identity_labels(info)
        w.buf += self.node_labels
        if sample.trace_id:
            w.buf += self._label(semconv.PPROF_LABEL_TRACE_ID, text=sample.trace_id)
        if sample.span_id:
            w.buf += self._label(semconv.PPROF_LABEL_SPAN_ID, text=sample.span_id)
        for key, value in sample.attributes:
            if isinstance(value, int) and not isinstance(value, bool):
                w.buf += self._label(key, num=value)
            else:
                w.buf += self._label(key, text=str(value))
        return w.buf

    def _identity_labels(self, info: ProcessInfo) -> bytes:
        """The process's identity beyond its pid, as on its OTLP resource and GPU metrics (procfs.identity_attributes)
        with ``_`` for ``.`` (container_id, service_name, k8s_pod_uid, ...), and its rank as ``rank``: encoded once
        per process."""
        encoded = self.identity.get(id(info))
        if encoded is None:
            parts = []
            for key, value in identity_attributes(info):
                if key == semconv.PROCESS_PID:
                    continue
                label = semconv.PPROF_LABEL_RANK if key == semconv.DISTRIBUTED_RANK else key.replace(".", "_")
                if key.startswith("distributed.") and key != semconv.DISTRIBUTED_RANK:
                    continue
                parts.append(self._label(label, text=str(value)))
            encoded = self.identity[id(info)] = b"".join(parts)
        return encoded

    def _label(self, key: str, *, text: str = "", num: int = 0) -> bytes:
        """The whole ``label`` field (tag, length, message), cached: most labels repeat across samples."""
        encoded = self.labels.get((key, text, num))
        if encoded is None:
            label = _Writer()
            label.uint(1, self.s(key))
            if text:
                label.uint(2, self.s(text))
            else:
                label.uint(3, num)
            field = _Writer()
            field.data(3, label.buf)
            encoded = self.labels[(key, text, num)] = bytes(field.buf)
        return encoded

    def _mapping_id(self, mapping: Mapping | None) -> int:
        if mapping is None:
            return 0
        mapping_id = self.mappings.get(mapping)
        if mapping_id is None:
            mapping_id = self.mappings[mapping] = len(self.mappings) + 1
        return mapping_id

    def _mapping(self, mapping: Mapping, mapping_id: int) -> bytearray:
        w = _Writer()
        w.uint(1, mapping_id)
        w.uint(2, mapping.start)
        w.uint(3, mapping.limit)
        w.uint(4, mapping.file_offset)
        w.uint(5, self.s(mapping.path))
        w.uint(6, self.s(mapping.build_id))
        w.uint(7, 1)  # has_functions: frames carry names, so readers do not try to symbolize again
        return w.buf

    def _function_id(self, frame: Frame) -> int:
        key = (frame.function, _system_name(frame), frame.filename)
        function_id = self.functions.get(key)
        if function_id is None:
            function_id = self.functions[key] = len(self.functions) + 1
            w = _Writer()
            w.uint(1, function_id)
            w.uint(2, self.s(key[0]))
            w.uint(3, self.s(key[1]))
            w.uint(4, self.s(key[2]))
            self.functions_out.data(_P_FUNCTION, w.buf)
        return function_id

    def _location(self, frame: Frame) -> bytes:
        """The varint of ``frame``'s location id, adding the location (deduplicated by value) when new."""
        location_id = self.locations.get(frame)
        if location_id is None:
            location_id = self.locations[frame] = len(self.locations) + 1
            w = _Writer()
            w.uint(1, location_id)
            w.uint(2, self._mapping_id(frame.mapping))
            w.uint(3, frame.address)
            line = _Writer()
            line.uint(1, self._function_id(frame))
            line.uint(2, frame.line)
            w.data(4, line.buf)
            self.locations_out.data(_P_LOCATION, w.buf)
        encoded = self.location_varints[id(frame)] = varint_bytes(location_id)
        return encoded


def _system_name(frame: Frame) -> str:
    """The function's system name. pprof takes a name equal to its system name that holds <...> for demangled C++
    and cuts the brackets out, which left Python's `<module>`, `<lambda>`, `<listcomp>` blank: a Python frame's
    system name is its file and name."""
    if frame.system_name:
        return frame.system_name
    if frame.kind == FrameKind.PYTHON and frame.filename:
        return f"{frame.filename}:{frame.function}"
    return frame.function
