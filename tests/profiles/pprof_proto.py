# SPDX-License-Identifier: Apache-2.0
"""The pprof ``perftools.profiles`` messages, built at run time with protobuf's descriptor API (tests only).

Independent of the encoder's hand-written wire code, so decoding with these classes checks it.
"""

from __future__ import annotations

import gzip

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    # name: [(field, number, type, label, message type)]
    "ValueType": [("type", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
                  ("unit", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "")],
    "Label": [("key", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
              ("str", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
              ("num", 3, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""), ("num_unit", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "")],
    "Sample": [("location_id", 1, _F.TYPE_UINT64, _F.LABEL_REPEATED, ""),
               ("value", 2, _F.TYPE_INT64, _F.LABEL_REPEATED, ""),
               ("label", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Label")],
    "Mapping": [("id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
                ("memory_start", 2, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
                ("memory_limit", 3, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
                ("file_offset", 4, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
                ("filename", 5, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
                ("build_id", 6, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
                ("has_functions", 7, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, "")],
    "Line": [("function_id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
             ("line", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "")],
    "Location": [("id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
                 ("mapping_id", 2, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
                 ("address", 3, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""),
                 ("line", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Line")],
    "Function": [("id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, ""), ("name", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
                 ("system_name", 3, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
                 ("filename", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "")],
    "Profile": [("sample_type", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ValueType"),
                ("sample", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Sample"),
                ("mapping", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Mapping"),
                ("location", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Location"),
                ("function", 5, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Function"),
                ("string_table", 6, _F.TYPE_STRING, _F.LABEL_REPEATED, ""),
                ("time_nanos", 9, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
                ("duration_nanos", 10, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
                ("period_type", 11, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "ValueType"),
                ("period", 12, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
                ("comment", 13, _F.TYPE_INT64, _F.LABEL_REPEATED, ""),
                ("default_sample_type", 14, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "")],
}


def _build_profile_class():  # type: ignore[no-untyped-def]
    file_proto = descriptor_pb2.FileDescriptorProto(name="otel_gpu_test_pprof.proto",
                                                    package="otelgputest.perftools.profiles", syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = file_proto.message_type.add(name=name)
        for field_name, number, field_type, label, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=field_type, label=label)
            if type_name:
                field.type_name = f".otelgputest.perftools.profiles.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("otelgputest.perftools.profiles.Profile"))


Profile = _build_profile_class()


def decode(data: bytes):  # type: ignore[no-untyped-def]
    """A pprof Profile message from (optionally gzipped) bytes."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    profile = Profile()
    profile.ParseFromString(data)
    return profile


def stacks(profile) -> dict[tuple[str, ...], list[int]]:  # type: ignore[no-untyped-def]
    """Function names of each sample's stack (leaf first) -> summed values."""
    strings = profile.string_table
    functions = {f.id: strings[f.name] for f in profile.function}
    locations = {loc.id: functions[loc.line[0].function_id] for loc in profile.location}
    out: dict[tuple[str, ...], list[int]] = {}
    for sample in profile.sample:
        key = tuple(locations[i] for i in sample.location_id)
        total = out.setdefault(key, [0] * len(sample.value))
        for i, value in enumerate(sample.value):
            total[i] += value
    return out
