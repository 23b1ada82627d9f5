"""Constants of MegBrain's FlatBuffers graph file (``serializer_oss.cpp``, ``schema.fbs``).

A file is one or more graphs back to back; each graph is::

    uint32 magic 0x5342474D ("MGBS")   4 zero bytes   uint64 offset F
    tensor values (F bytes, in the order the operators wrote them)
    uint32 size S, then S bytes: a FlatBuffer with file identifier "mgb1" and root ``Graph``

all little-endian. Field slots below are the schema's declaration order (a union takes two:
its type, then its value).
"""

from __future__ import annotations

import struct

import xxhash

__all__ = [
    "MGB_MAGIC",
    "MGB_VERSION",
    "FILE_IDENTIFIER",
    "HEADER",
    "MAX_NDIM",
    "content_hash",
]

MGB_MAGIC = 0x5342474D
#: MegBrain 8.6.0 (MegEngine v0.6.0): (major * 1000 + minor) * 100 + patch
MGB_VERSION_TUPLE = (8, 6, 0)
MGB_VERSION = (MGB_VERSION_TUPLE[0] * 1000 + MGB_VERSION_TUPLE[1]) * 100 + MGB_VERSION_TUPLE[2]
#: versions at or above this are not MegBrain versions at all (major 100+)
MGB_VERSION_LIMIT = 100 * 1000 * 100
FILE_IDENTIFIER = b"mgb1"
#: magic, reserved, offset to the FlatBuffer from the tensor start
HEADER = struct.Struct("<IIQ")
#: MegDNN's MAX_NDIM
MAX_NDIM = 7

#: seed of MegBrain's ``XXHash`` class, which hashes graph contents
_CONTENT_HASH_SEED = 0x4B4E74B36B5D11


def content_hash(data: bytes) -> int:
    """The graph hash of ``data`` (MegBrain's ``XXHash``: XXH64 with its seed, at least 1)."""
    return max(xxhash.xxh64_intdigest(data, seed=_CONTENT_HASH_SEED), 1)


# table slots
class GraphSlot:
    MGB_VERSION, HASH, NR_SHARED_TENSOR, OPRS, OUTPUT_VARS_IDX = range(5)


class OprSlot:
    (
        TYPE_ID,
        PARAM_TYPE,
        PARAM,
        INPUTS,
        COMP_NODE,
        OUTPUT_NAME,
        OUTPUT_DTYPE,
        TENSORS,
        PRIORITY,
        BLOBS,
        ADDITIONAL_PARAMS_TYPE,
        ADDITIONAL_PARAMS,
    ) = range(12)


class TensorSlot:
    NAME, SHAPE, COMP_NODE, DTYPE, DATA_SIZE, OFFSET = range(6)
