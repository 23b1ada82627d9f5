"""Decode one of our dumps with a minimal FlatBuffers decoder written here from schema.fbs,
independent of megbrain's reader: what MegBrain itself would read."""

import struct

import numpy as np
import xxhash

import megbrain as mgb


class Tbl:
    def __init__(self, buf, pos):
        self.buf, self.pos = buf, pos
        vt = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vt_len = struct.unpack_from("<H", buf, vt)[0]
        self.vt = vt

    def off(self, slot):
        e = 4 + 2 * slot
        if e >= self.vt_len:
            return 0
        return struct.unpack_from("<H", self.buf, self.vt + e)[0]

    def get(self, slot, fmt, default=0):
        o = self.off(slot)
        return struct.unpack_from("<" + fmt, self.buf, self.pos + o)[0] if o else default

    def ref(self, slot):
        o = self.off(slot)
        if not o:
            return None
        p = self.pos + o
        return p + struct.unpack_from("<I", self.buf, p)[0]

    def sub(self, slot):
        p = self.ref(slot)
        return None if p is None else Tbl(self.buf, p)

    def vec(self, slot, fmt):
        p = self.ref(slot)
        if p is None:
            return None
        (n,) = struct.unpack_from("<I", self.buf, p)
        return list(struct.unpack_from(f"<{n}{fmt}", self.buf, p + 4))

    def tables(self, slot):
        p = self.ref(slot)
        if p is None:
            return []
        (n,) = struct.unpack_from("<I", self.buf, p)
        out = []
        for i in range(n):
            q = p + 4 + 4 * i
            out.append(Tbl(self.buf, q + struct.unpack_from("<I", self.buf, q)[0]))
        return out

    def string(self, slot):
        p = self.ref(slot)
        if p is None:
            return None
        (n,) = struct.unpack_from("<I", self.buf, p)
        return self.buf[p + 4 : p + 4 + n].decode()


def test_decode_independently(tmp_path):
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2, 3), name="x")
    w = mgb.make_shared(
        "cpu0", value=np.arange(6, dtype="float32").reshape(2, 3), comp_graph=g, name="w"
    )
    y = mgb.opr.elemwise(x, w, mode="add").rename("y")
    path = tmp_path / "g.mgb"
    res = mgb.serialize_comp_graph_to_file(str(path), [y], keep_param_name=True)
    data = path.read_bytes()

    magic, reserved, offset = struct.unpack_from("<IIQ", data)
    assert magic == 0x5342474D and reserved == 0
    tensors = data[16 : 16 + offset]
    assert tensors == np.arange(6, dtype="float32").tobytes()
    (size,) = struct.unpack_from("<I", data, 16 + offset)
    buf = data[20 + offset : 20 + offset + size]
    assert 20 + offset + size == len(data)
    assert buf[4:8] == b"mgb1"
    root = Tbl(buf, struct.unpack_from("<I", buf, 0)[0])
    assert root.get(0, "I") == (8 * 1000 + 6) * 100 + 0  # mgb_version of 8.6.0
    assert root.get(1, "Q") == res.content_hash != 0
    assert root.get(2, "I") == 1  # nr_shared_tensor
    oprs = root.tables(3)
    ids = [o.get(0, "Q") for o in oprs]

    def tid(name):
        return xxhash.xxh64_intdigest(name.encode(), seed=20160701)

    assert ids == [tid("Host2DeviceCopy"), tid("SharedDeviceTensor"), tid("Elemwise")]
    h2d, shared, ew = oprs
    # Host2DeviceCopy: param.Host2DeviceCopy (union 63) at its defaults, a META_INPUT tensor
    assert h2d.get(1, "B") == 63
    (t,) = h2d.tables(7)
    assert t.string(0) == "x" and t.vec(1, "I") == [2, 3] and t.get(4, "I") == 0
    assert t.sub(2).string(0) == "cpu0:0"
    assert t.sub(3).get(0, "b") == 0  # Float32
    # SharedDeviceTensor: no param, one VALUE_SHARED tensor of 24 bytes named w
    assert sh_param(shared) == 0
    (t,) = shared.tables(7)
    assert t.string(0) == "w" and t.get(4, "I") == 24
    # Elemwise: param.Elemwise (union 17) with mode ADD (member index 16), inputs 0 and 1
    assert ew.get(1, "B") == 17
    assert ew.sub(2).get(0, "I") == 16
    assert ew.vec(3, "I") == [0, 1]
    assert [s for s in [ew_name(ew)]] == ["y"]
    # output_vars_idx: (compact id 2, the var's id at dump time)
    outs = root.ref(4)
    (n,) = struct.unpack_from("<I", buf, outs)
    assert n == 1 and struct.unpack_from("<II", buf, outs + 4) == (2, y.node.id)


def sh_param(opr):
    return opr.get(1, "B")


def ew_name(opr):
    p = opr.ref(5)
    (n,) = struct.unpack_from("<I", opr.buf, p)
    assert n == 1
    q = p + 4
    s = q + struct.unpack_from("<I", opr.buf, q)[0]
    (ln,) = struct.unpack_from("<I", opr.buf, s)
    return opr.buf[s + 4 : s + 4 + ln].decode()
