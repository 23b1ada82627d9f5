"""Tests of megbrain.dtype: names, enum numbers, canonization, quantization round trips."""

import pickle
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from megbrain import dtype as D
from megbrain.errors import ConversionError

FAST = settings(max_examples=40, deadline=None)

PLAIN = {
    "Float32": np.float32,
    "Float16": np.float16,
    "BFloat16": ml_dtypes.bfloat16,
    "Int8": np.int8,
    "Int16": np.int16,
    "Int32": np.int32,
    "Uint8": np.uint8,
    "Bool": np.bool_,
}
SPECIAL = {"IntB1": D.intb1, "IntB2": D.intb2, "IntB4": D.intb4, "UintB4": D.uintb4}
SPECIAL["Byte"] = D.byte
# kind -> (factory args, MegBrain name, storage, qmin, qmax)
QUANT = {
    "qint8": ((0.25,), "QuantizedS8", np.int8, -128, 127),
    "quint8": ((0.25, 128), "Quantized8Asymm", np.uint8, 0, 255),
    "qint32": ((0.25,), "QuantizedS32", np.int32, -(2**31), 2**31 - 1),
    "qint4": ((0.25,), "QuantizedS4", np.int8, -8, 7),
    "quint4": ((0.25, 8), "Quantized4Asymm", np.uint8, 0, 15),
    "qint16": ((0.25,), "QuantizedS16", np.int16, -32768, 32767),
}
ENUM = [
    "Float32",
    "Uint8",
    "Int8",
    "Int16",
    "Int32",
    "IntB1",
    "IntB2",
    "IntB4",
    "Byte",
    "Float16",
    "UintB4",
    "Quantized8Asymm",
    "QuantizedS32",
    "QuantizedS8",
    "Quantized4Asymm",
    "QuantizedS4",
    "QuantizedS16",
    "BFloat16",
    "Bool",
]
REJECTED = [
    np.float64,
    "float64",
    np.int64,
    "int64",
    np.uint16,
    np.uint32,
    np.uint64,
    np.complex64,
    complex,
    object,
    str,
    bytes,
    "U3",
    "S4",
    "M8[s]",
    "m8[s]",
    np.dtype([("a", "i4")]),
    np.dtype(("f4", (2,))),
    "V4",
    ml_dtypes.float8_e4m3fn,
    np.longdouble,
]


def qdtype(kind):
    return getattr(D, kind)(*QUANT[kind][0])


def all_dtypes():
    return (
        [np.dtype(t) for t in PLAIN.values()] + list(SPECIAL.values()) + [qdtype(k) for k in QUANT]
    )


# --- names, sizes, enum numbers --------------------------------------------------------------


@pytest.mark.parametrize("name,t", PLAIN.items())
def test_plain_names(name, t):
    assert D.dtype_name(t) == name
    assert D.dtype_name(np.dtype(t)) == name
    assert D.dtype_size(t) == np.dtype(t).itemsize
    assert D.canonize_dtype(name) == np.dtype(t)


@pytest.mark.parametrize("name,dt", SPECIAL.items())
def test_special_dtypes(name, dt):
    assert D.dtype_name(dt) == name
    assert D.dtype_size(dt) == 1
    assert dt.metadata == {"mgb_dtype": {"name": name}}
    assert D.canonize_dtype(dt) is dt
    assert D.canonize_dtype(name.lower()) is dt
    assert D.canonize_dtype(name) is dt
    assert D.is_lowbit(dt) == (name != "Byte")
    assert not D.is_quantize(dt)


@pytest.mark.parametrize("kind", QUANT)
def test_quantized_factories(kind):
    args, name, storage, _, _ = QUANT[kind]
    dt = qdtype(kind)
    assert dt == np.dtype(storage) and dt.itemsize == np.dtype(storage).itemsize
    assert D.dtype_name(dt) == name and D.dtype_size(dt) == dt.itemsize
    assert D.is_quantize(dt) and not D.is_bfloat16(dt)
    assert D.is_lowbit(dt) == (kind in ("qint4", "quint4"))
    assert D.get_scale(dt) == 0.25
    assert D.get_quantized_dtype(kind, *args).metadata == dt.metadata
    assert D.get_quantized_dtype(name, *args).metadata == dt.metadata
    assert D.canonize_dtype(dt) is dt and D.to_mgb_supported_dtype(dt) is dt
    if len(args) == 2:
        assert D.get_zero_point(dt) == args[1]
    else:
        with pytest.raises(ConversionError, match=name):
            D.get_zero_point(dt)


def test_enum_numbers_match_megbrain():
    for i, name in enumerate(ENUM):
        dt = D.dtype_from_num(
            i, *((0.5, 3) if "Asymm" in name else (0.5,) if "Quant" in name else ())
        )
        assert D.dtype_name(dt) == name
        assert D.get_dtype_num(dt) == i == D.get_serialized_dtype(dt)


@pytest.mark.parametrize("dt", all_dtypes(), ids=D.dtype_name)
def test_num_round_trip_keeps_params(dt):
    num = D.get_dtype_num(dt)
    scale = D.get_scale(dt) if D.is_quantize(dt) else None
    zp = D.get_zero_point(dt) if "Asymm" in D.dtype_name(dt) else None
    back = D.dtype_from_num(num, scale, zp)
    assert back == dt and back.metadata == dt.metadata and back.type is dt.type


@pytest.mark.parametrize(
    "args",
    [(-1,), (19,), (True,), (1.0,), (0, 1.0), (2, None, 0), (13,), (11, 1.0), (11, 1.0, 256)],
)
def test_dtype_from_num_rejects(args):
    with pytest.raises(ConversionError):
        D.dtype_from_num(*args)


# --- canonize / to_mgb_supported_dtype ----------------------------------------------------------


def test_canonize_python_and_numpy_types():
    assert D.canonize_dtype(float) == np.float32
    assert D.canonize_dtype(int) == np.int32
    assert D.canonize_dtype(bool) == np.bool_
    assert D.canonize_dtype(np.dtype(">f4")) == np.float32
    assert D.canonize_dtype(np.dtype(">f4")).isnative
    assert D.canonize_dtype(np.intc) == np.int32
    assert D.canonize_dtype("bfloat16") is D.bfloat16
    assert D.canonize_dtype(ml_dtypes.bfloat16) == D.bfloat16
    assert D.canonize_dtype(np.dtype(np.float32, metadata={"other": 1})).metadata is None


@pytest.mark.parametrize("bad", REJECTED, ids=str)
def test_canonize_rejects(bad):
    with pytest.raises(ConversionError, match="not supported") as info:
        D.canonize_dtype(bad)
    assert str(np.dtype(bad)) in str(info.value)
    with pytest.raises(ConversionError):
        D.dtype_name(bad)
    with pytest.raises(ConversionError):
        D.dtype_size(bad)
    with pytest.raises(ConversionError):
        D.get_dtype_num(bad)


@pytest.mark.parametrize("bad", [None, "qint8", "no_such_dtype", 3.5])
def test_canonize_rejects_non_dtypes(bad):
    with pytest.raises(ConversionError, match=repr(bad) if bad is not None else "None"):
        D.canonize_dtype(bad)


@pytest.mark.parametrize(
    "meta",
    [
        {"name": "Nope"},
        {"name": 3},
        {"name": "QuantizedS8"},
        {"name": "QuantizedS8", "scale": -1.0},
        {"name": "QuantizedS16", "scale": 1.0},  # int8 storage, int16 expected
        {"name": "Quantized8Asymm", "scale": 1.0},
        {"name": "Quantized8Asymm", "scale": 1.0, "zero_point": 300},
        {"name": "Byte"},  # int8 storage, uint8 expected
    ],
)
def test_canonize_rejects_bad_metadata(meta):
    dt = np.dtype(np.int8, metadata={"mgb_dtype": meta})
    with pytest.raises(ConversionError, match="not supported"):
        D.canonize_dtype(dt)


def test_to_mgb_supported_dtype():
    assert D.to_mgb_supported_dtype(np.int64) == np.int32
    assert D.to_mgb_supported_dtype("float64") == np.float32
    assert D.to_mgb_supported_dtype(np.longlong) == np.int32
    assert D.to_mgb_supported_dtype(np.float16) == np.float16
    assert D.to_mgb_supported_dtype(float) == np.float32
    for dt in [D.bfloat16, D.intb1, D.intb2, D.intb4, D.byte, D.qint8(0.1), D.quint4(0.1, 1)]:
        assert D.to_mgb_supported_dtype(dt) is dt
    for bad in [np.uint64, np.uint32, np.uint16, np.complex128, object, "U2"]:
        with pytest.raises(ConversionError, match=str(np.dtype(bad))):
            D.to_mgb_supported_dtype(bad)


# --- predicates and accessors -------------------------------------------------------------------


def test_predicates_on_plain_dtypes():
    for t in PLAIN.values():
        assert not D.is_quantize(t) and not D.is_lowbit(t)
        assert D.is_bfloat16(t) == (t is ml_dtypes.bfloat16)
        with pytest.raises(ConversionError, match="not a quantized"):
            D.get_scale(t)
        with pytest.raises(ConversionError, match="not a quantized"):
            D.get_zero_point(t)
    assert D.is_bfloat16("bfloat16") and D.is_bfloat16(D.bfloat16)
    assert not (D.is_quantize(None) or D.is_lowbit(None) or D.is_bfloat16(None))
    with pytest.raises(ConversionError, match="dtype"):
        D.is_quantize("no_such_dtype")


# --- metadata survives round trips --------------------------------------------------------------


@pytest.mark.parametrize("dt", all_dtypes(), ids=D.dtype_name)
def test_metadata_survives(dt):
    again = pickle.loads(pickle.dumps(dt))
    assert np.dtype(dt) is dt
    assert again == dt and again.metadata == dt.metadata
    assert D.dtype_name(again) == D.dtype_name(dt)
    arr = np.zeros(3, dt)
    assert pickle.loads(pickle.dumps(arr)).dtype.metadata == dt.metadata
    assert arr.copy().dtype.metadata == dt.metadata and arr[1:].dtype.metadata == dt.metadata


# --- quantized dtype validation ------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), "0.1", None, True])
def test_bad_scale(scale):
    for kind in QUANT:
        args = (scale, 0) if len(QUANT[kind][0]) == 2 else (scale,)
        with pytest.raises(ConversionError, match="scale") as info:
            getattr(D, kind)(*args)
        assert repr(scale) in str(info.value)


@pytest.mark.parametrize(
    "kind,zp", [("quint8", -1), ("quint8", 256), ("quint4", 16), ("quint8", 1.5)]
)
def test_bad_zero_point(kind, zp):
    with pytest.raises(ConversionError, match="zero_point") as info:
        getattr(D, kind)(0.1, zp)
    assert repr(zp) in str(info.value)


def test_get_quantized_dtype_checks():
    assert D.get_quantized_dtype("qint8", 2, 0).metadata["mgb_dtype"]["scale"] == 2.0
    assert D.quint8(np.float32(0.5), np.int64(7)).metadata["mgb_dtype"]["zero_point"] == 7
    with pytest.raises(ConversionError, match="zero_point"):
        D.get_quantized_dtype("quint8", 0.1)
    with pytest.raises(ConversionError, match="symmetric"):
        D.get_quantized_dtype("qint8", 0.1, 3)
    with pytest.raises(ConversionError, match="qint9"):
        D.get_quantized_dtype("qint9", 0.1)


# --- quantize / dequantize ----------------------------------------------------------------------


def _round_trip_case(kind):
    _, _, _, qmin, qmax = QUANT[kind]
    scale = st.floats(1e-3, 10.0)
    zp = st.integers(qmin, qmax) if kind.startswith("qu") else st.just(None)

    @FAST
    @given(scale=scale, zp=zp, data=st.data())
    def check(scale, zp, data):
        dt = D.get_quantized_dtype(kind, scale, zp)
        z = 0 if zp is None else zp
        lo, hi = (qmin - z) * scale, (qmax - z) * scale
        unit = hnp.arrays(np.float64, st.integers(0, 8), elements=st.floats(0, 1))
        x = (lo + data.draw(unit) * (hi - lo)).astype(np.float32)
        q = getattr(D, f"convert_to_{kind}")(x, dt)
        assert q.dtype == dt and q.dtype.metadata == dt.metadata
        assert q.size == 0 or (q.min() >= qmin and q.max() <= qmax)
        back = getattr(D, f"convert_from_{kind}")(q)
        assert back.dtype == np.float32
        tol = scale / 2 * (1 + 1e-5) + abs(x).max(initial=0) * 1e-6
        np.testing.assert_array_less(np.abs(back.astype(np.float64) - x), tol)

    return check


@pytest.mark.parametrize("kind", [k for k in QUANT if k != "qint32"])
def test_quantize_round_trip(kind):
    _round_trip_case(kind)()


def test_qint32_round_trip():
    dt = D.qint32(0.5)
    x = np.array([-3.2, 0.0, 0.74, 1e6], np.float32)
    back = D.convert_from_qint32(D.convert_to_qint32(x, dt))
    np.testing.assert_allclose(back, [-3.0, 0.0, 0.5, 1e6])


def test_quantize_clips_and_formula():
    dt = D.quint8(0.5, 10)
    q = D.convert_to_quint8([-100.0, 0.0, 1.0, 1000.0], dt)
    assert q.tolist() == [0, 10, 12, 255]
    np.testing.assert_array_equal(D.convert_from_quint8(q), [-5.0, 0.0, 1.0, 122.5])
    assert D.convert_to_qint4(np.array([-9.0, 9.0]), D.qint4(1.0)).tolist() == [-8, 7]
    assert D.convert_to_quint4(np.array([-9.0, 90.0]), D.quint4(1.0, 3)).tolist() == [0, 15]


def test_converters_check_dtype():
    with pytest.raises(ConversionError, match="QuantizedS8"):
        D.convert_to_qint8(np.ones(2), D.quint8(0.1, 1))
    with pytest.raises(ConversionError, match="not a quantized"):
        D.convert_to_qint8(np.ones(2), np.int8)
    with pytest.raises(ConversionError, match="QuantizedS8"):
        D.convert_from_qint8(np.ones(2, np.int8))
    with pytest.raises(ConversionError, match="Quantized8Asymm"):
        D.convert_from_quint8(D.convert_to_qint8(np.ones(2), D.qint8(0.1)))
    with pytest.raises(ConversionError, match="object"):
        D.convert_to_qint8(np.array([None]), D.qint8(0.1))
    assert D.convert_to_qint8.__name__ == "convert_to_qint8"
    assert "QuantizedS8" in D.convert_from_qint8.__doc__


# --- convert_array ------------------------------------------------------------------------------


@FAST
@given(
    x=hnp.arrays(
        st.sampled_from([np.float64, np.int64, np.float32, np.int8, np.bool_]),
        hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
        elements={"allow_nan": False, "min_value": -100, "max_value": 100},
    ),
    target=st.sampled_from([np.float32, np.float16, np.int32, np.int16, np.uint8, "bfloat16"]),
)
def test_convert_array_casts(x, target):
    out = D.convert_array(x, target)
    assert out.dtype == D.canonize_dtype(target) and out.shape == x.shape
    np.testing.assert_array_equal(out, x.astype(D.canonize_dtype(target)))


def test_convert_array_default_dtype():
    assert D.convert_array([1.5, 2.0]).dtype == np.float32
    assert D.convert_array(3).dtype == np.int32
    assert D.convert_array(np.arange(3, dtype=np.int16)).dtype == np.int16
    assert D.convert_array([True]).dtype == np.bool_
    x = np.ones(3, np.float32)
    assert D.convert_array(x, np.float32) is x


def test_convert_array_special_targets():
    out = D.convert_array([1, -2], D.intb4)
    assert out.dtype.metadata == D.intb4.metadata and out.tolist() == [1, -2]
    dt = D.qint8(0.5)
    q = D.convert_array(np.array([3, -4]), dt)
    assert q.dtype.metadata == dt.metadata and q.tolist() == [3, -4]
    assert D.convert_array(q, dt) is q
    with pytest.raises(ConversionError, match="convert_to_qint8"):
        D.convert_array([0.5], dt)
    with pytest.raises(ConversionError, match="range"):
        D.convert_array([200], dt)
    with pytest.raises(ConversionError, match="QuantizedS8"):
        D.convert_array(q, np.float32)
    with pytest.raises(ConversionError, match="QuantizedS8"):
        D.convert_array(q, D.qint8(0.25))
    bf = D.convert_array([1.0, 3.0], "bfloat16")
    assert bf.dtype == D.bfloat16 and bf.astype(np.float32).tolist() == [1.0, 3.0]


@pytest.mark.parametrize(
    "value,name",
    [
        (np.array([1, "a"], dtype=object), "object"),
        (["a", "b"], "<U1"),
        (np.array([b"x"]), "|S1"),
        (np.array([1 + 2j]), "complex128"),
        (np.array(["2020-01-01"], dtype="M8[D]"), "datetime64[D]"),
    ],
)
def test_convert_array_rejects_values(value, name):
    with pytest.raises(ConversionError) as info:
        D.convert_array(value, np.float32)
    assert name in str(info.value)


def test_convert_array_rejects_targets_and_ragged():
    with pytest.raises(ConversionError, match="float64"):
        D.convert_array([1.0], np.float64)
    with pytest.raises(ConversionError, match="int64"):
        D.convert_array([1], "int64")
    with pytest.raises(ConversionError):
        D.convert_array([[1], [1, 2]], np.float32)


# --- bfloat16 -----------------------------------------------------------------------------------


@FAST
@given(st.floats(-(2.0**100), 2.0**100, allow_nan=False, allow_subnormal=False, width=32))
def test_bfloat16_values(v):
    b = D.convert_array(np.float32(v), D.bfloat16)
    assert b.dtype == D.bfloat16 and D.dtype_size(b.dtype) == 2
    back = float(b.astype(np.float32))
    assert abs(back - v) <= abs(v) * 2**-8
    bits = np.float32(back).view(np.uint32)
    assert bits & 0xFFFF == 0  # bfloat16 is the upper half of a float32


def test_bfloat16_specials():
    x = np.array([np.inf, -np.inf, np.nan, 1.0, 65504.0, 3e38], np.float32)
    b = D.convert_array(x, "bfloat16")
    back = b.astype(np.float32)
    assert np.isposinf(back[0]) and np.isneginf(back[1]) and np.isnan(back[2])
    assert back[3] == 1.0 and back[4] == 65536.0 and np.isfinite(back[5])
    assert D.get_dtype_num(b.dtype) == 17 and D.dtype_name(b.dtype) == "BFloat16"


def test_bfloat16_is_imported_on_first_use():
    # ml_dtypes' import costs more than the rest of ``import megbrain``; only asking for
    # bfloat16 may import it, and then every way of naming it gives one dtype
    code = (
        "import sys, megbrain as mgb\n"
        "assert 'ml_dtypes' not in sys.modules\n"
        "assert not mgb.dtype.is_bfloat16('float16')\n"
        "assert mgb.dtype.canonize_dtype('float16').name == 'float16'\n"
        "assert 'ml_dtypes' not in sys.modules\n"
        "import ml_dtypes\n"
        "from megbrain import mgb as m\n"
        "bf = mgb.dtype.canonize_dtype('bfloat16')\n"
        "assert bf is mgb.dtype.bfloat16 is m.bfloat16 == ml_dtypes.bfloat16\n"
        "assert mgb.dtype.is_bfloat16(bf) and mgb.dtype.dtype_name(bf) == 'BFloat16'\n"
        "assert mgb.dtype.dtype_from_num(mgb.dtype.get_dtype_num(bf)) is bf\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
