"""Helpers of the serialization tests that read a dumped file itself."""

import struct

from megbrain.serialization import fbs, sereg
from megbrain.serialization.format import GraphSlot, OprSlot


def file_tables(path) -> dict:
    """{registered name: param table names in the order written} of the operators of the
    first graph in the file at ``path``, read from the file's FlatBuffers (an operator name
    seen twice must have the same tables each time)."""
    with open(path, "rb") as f:
        data = f.read()
    _, _, offset = struct.unpack_from("<IIQ", data)
    pos = 16 + offset
    (size,) = struct.unpack_from("<I", data, pos)
    root = fbs.Reader(data[pos + 4 : pos + 4 + size]).root(b"mgb1")
    union = sereg.OPERATOR_PARAM_UNION
    out: dict = {}
    for tbl in root.tables(GraphSlot.OPRS, "oprs"):
        name = sereg.find_by_type_id(tbl.scalar(OprSlot.TYPE_ID, "Q", 0)).name
        kinds = [tbl.scalar(OprSlot.PARAM_TYPE, "B", 0)]
        kinds += list(tbl.raw_bytes(OprSlot.ADDITIONAL_PARAMS_TYPE, "extra") or b"")
        tables = tuple(union[k - 1] for k in kinds if k)
        assert out.setdefault(name, tables) == tables, name
    return out
