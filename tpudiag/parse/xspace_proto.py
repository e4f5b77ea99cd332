"""The XSpace protobuf (XProf's trace format) as Python message classes, built from its field numbers.

jaxlib's `ProfileData` reads events fast but hides what a TPU trace keeps in event metadata: the
HLO instruction name (`display_name`), the program fingerprint, category, FLOPs and bytes of each
op, and the HLO modules themselves (`/host:metadata`). This module declares the messages of
`tsl/profiler/protobuf/xplane.proto` (field numbers as published there) so protobuf's own parser
reads a whole trace, and the head of each stored HLO module; nothing here interprets it (that is
`parse/device_planes.py`).
"""

from __future__ import annotations

from functools import cache

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_T = descriptor_pb2.FieldDescriptorProto
# message -> [(field, number, type, label, message type or None, oneof index or None)]
_MESSAGES = {
    "XSpace": [("planes", 1, _T.TYPE_MESSAGE, _T.LABEL_REPEATED, "XPlane", None),
               ("errors", 2, _T.TYPE_STRING, _T.LABEL_REPEATED, None, None),
               ("warnings", 3, _T.TYPE_STRING, _T.LABEL_REPEATED, None, None),
               ("hostnames", 4, _T.TYPE_STRING, _T.LABEL_REPEATED, None, None)],
    "XPlane": [("id", 1, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
               ("name", 2, _T.TYPE_STRING, _T.LABEL_OPTIONAL, None, None),
               ("lines", 3, _T.TYPE_MESSAGE, _T.LABEL_REPEATED, "XLine", None),
               ("event_metadata", 4, _T.TYPE_MESSAGE, _T.LABEL_REPEATED, "XPlane.EventMetadataEntry", None),
               ("stat_metadata", 5, _T.TYPE_MESSAGE, _T.LABEL_REPEATED, "XPlane.StatMetadataEntry", None),
               ("stats", 6, _T.TYPE_MESSAGE, _T.LABEL_REPEATED, "XStat", None)],
    "XLine": [("id", 1, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
              ("display_id", 10, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
              ("name", 2, _T.TYPE_STRING, _T.LABEL_OPTIONAL, None, None),
              ("display_name", 11, _T.TYPE_STRING, _T.LABEL_OPTIONAL, None, None),
              ("timestamp_ns", 3, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
              ("duration_ps", 9, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
              ("events", 4, _T.TYPE_MESSAGE, _T.LABEL_REPEATED, "XEvent", None)],
    "XEvent": [("metadata_id", 1, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
               ("offset_ps", 2, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, 0),
               ("num_occurrences", 5, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, 0),
               ("duration_ps", 3, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
               ("stats", 4, _T.TYPE_MESSAGE, _T.LABEL_REPEATED, "XStat", None)],
    "XStat": [("metadata_id", 1, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
              ("double_value", 2, _T.TYPE_DOUBLE, _T.LABEL_OPTIONAL, None, 0),
              ("uint64_value", 3, _T.TYPE_UINT64, _T.LABEL_OPTIONAL, None, 0),
              ("int64_value", 4, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, 0),
              ("str_value", 5, _T.TYPE_STRING, _T.LABEL_OPTIONAL, None, 0),
              ("bytes_value", 6, _T.TYPE_BYTES, _T.LABEL_OPTIONAL, None, 0),
              ("ref_value", 7, _T.TYPE_UINT64, _T.LABEL_OPTIONAL, None, 0)],
    "XEventMetadata": [("id", 1, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
                       ("name", 2, _T.TYPE_STRING, _T.LABEL_OPTIONAL, None, None),
                       ("display_name", 4, _T.TYPE_STRING, _T.LABEL_OPTIONAL, None, None),
                       ("metadata", 3, _T.TYPE_BYTES, _T.LABEL_OPTIONAL, None, None),
                       ("stats", 5, _T.TYPE_MESSAGE, _T.LABEL_REPEATED, "XStat", None),
                       ("child_id", 6, _T.TYPE_INT64, _T.LABEL_REPEATED, None, None)],
    "XStatMetadata": [("id", 1, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
                      ("name", 2, _T.TYPE_STRING, _T.LABEL_OPTIONAL, None, None),
                      ("description", 3, _T.TYPE_STRING, _T.LABEL_OPTIONAL, None, None)],
    # The head of XLA's HloProto (xla/service/hlo.proto), as `/host:metadata` stores each program:
    # its module's name and unique id (the NNNN of the dump's `module_NNNN.*` files). The rest of
    # the proto is skipped unread.
    "HloProtoHead": [("hlo_module", 1, _T.TYPE_MESSAGE, _T.LABEL_OPTIONAL, "HloModuleHead", None)],
    "HloModuleHead": [("name", 1, _T.TYPE_STRING, _T.LABEL_OPTIONAL, None, None),
                      ("id", 5, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None)],
}
_ONEOFS = {"XEvent": "data", "XStat": "value"}
_PACKAGE = "tpudiag.xspace"


def _add_fields(msg: descriptor_pb2.DescriptorProto, fields) -> None:
    for name, number, type_, label, type_name, oneof in fields:
        f = msg.field.add(name=name, number=number, type=type_, label=label)
        if type_name:
            f.type_name = f".{_PACKAGE}.{type_name}"
        if oneof is not None:
            f.oneof_index = oneof


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    fd = descriptor_pb2.FileDescriptorProto(name="tpudiag_xplane.proto", package=_PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        msg = fd.message_type.add(name=name)
        if name in _ONEOFS:
            msg.oneof_decl.add(name=_ONEOFS[name])
        _add_fields(msg, fields)
        if name == "XPlane":
            for entry, value in (("EventMetadataEntry", "XEventMetadata"), ("StatMetadataEntry", "XStatMetadata")):
                nested = msg.nested_type.add(name=entry)
                nested.options.map_entry = True
                _add_fields(nested, [("key", 1, _T.TYPE_INT64, _T.LABEL_OPTIONAL, None, None),
                                     ("value", 2, _T.TYPE_MESSAGE, _T.LABEL_OPTIONAL, value, None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return pool


def message_class(name: str):
    """A message class of this module (`XSpace`, `HloProtoHead`): parse with `cls.FromString(data)`."""
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"{_PACKAGE}.{name}"))
