"""The Python layer on a machine without a GPU: a buffer of host memory (``_host_buffer``)
has the Python surface of a GPU buffer (copies, NumPy views, DLPack export, typed views,
closing, threads), and the same Rust underneath, with the CPU as its DLPack device."""

from __future__ import annotations

import ctypes
import gc
import random
import threading

import pytest

import gdr
from gdr._gdr import _host_buffer

np = pytest.importorskip("numpy")

SIZES = [1, 2, 3, 7, 8, 15, 63, 64, 65, 127, 255, 257, 4095, 4096, 4097, 65535, 65536, 65537,
         (1 << 20) + 5]
OFFSETS = [0, 1, 3, 63, 64, 4095]


def rand_bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def test_round_trips_are_byte_exact_at_odd_sizes_and_offsets(live):
    buf = _host_buffer((1 << 20) + 8192)
    for i, size in enumerate(SIZES):
        for off in OFFSETS:
            data = rand_bytes(size, i * 100 + off)
            guard = rand_bytes(size + 2, 7)
            buf.write(guard, off)  # poisons the bytes around the range
            buf.write(data, off + 1)
            assert buf.read(size, off + 1) == data, (size, off)
            out = bytearray(size)
            assert buf.read_into(out, off + 1) == size
            assert bytes(out) == data
            assert buf.read(1, off) == guard[:1], "the byte before was written"
            assert buf.read(1, off + 1 + size) == guard[size + 1:], "the byte after was written"
    del buf


@pytest.mark.parametrize("threads", [2, 4, 8])
def test_parallel_copies_are_byte_exact(threads, live):
    buf = _host_buffer(3 << 20)
    for size in (4097, 1 << 20, (2 << 20) + 3):
        data = rand_bytes(size, size)
        buf.write(data, 5, threads=threads)
        assert buf.read(size, 5, threads=threads) == data
        out = np.zeros(size, np.uint8)
        buf.read_into(out, 5, threads=threads)
        assert out.tobytes() == data
    del buf


def test_bytes_like_objects_of_every_kind_are_taken():
    buf = _host_buffer(256)
    payload = bytes(range(40))
    import array

    for src in (
        payload,
        bytearray(payload),
        memoryview(payload),
        memoryview(payload)[5:25],
        np.frombuffer(payload, np.uint8),
        np.frombuffer(payload, np.uint32),
        array.array("B", payload),
    ):
        buf.write(bytes(256))
        buf.write(src, 10)
        want = bytes(memoryview(src).cast("B"))
        assert buf.read(len(want), 10) == want, type(src)
    # Into a typed NumPy array: its bytes.
    out = np.zeros(10, np.uint32)
    assert buf.read_into(out, 10) == 40
    assert out.tobytes() == payload


def test_bad_sources_and_destinations_are_refused_with_python_errors():
    buf = _host_buffer(64)
    with pytest.raises(TypeError):
        buf.write("text is not bytes")
    with pytest.raises((BufferError, ValueError)):
        buf.write(np.zeros((8, 8), np.uint8)[:, ::2])  # not contiguous
    with pytest.raises((BufferError, TypeError)):
        buf.read_into(b"read-only")
    with pytest.raises(ValueError, match="offset"):
        buf.write(b"x", -1)


def test_accesses_outside_the_buffer_raise_bounds_error_and_touch_nothing():
    buf = _host_buffer(100)
    buf.write(b"\x5a" * 100)
    with pytest.raises(gdr.BoundsError) as e:
        buf.write(b"x" * 10, 95)
    assert "outside a 100-byte mapping" in str(e.value)
    with pytest.raises(IndexError):
        buf.read(2, 99)
    with pytest.raises(gdr.BoundsError):
        buf.read(None, 101)
    with pytest.raises(gdr.BoundsError):
        buf.read_into(bytearray(2), 99)
    assert buf.read() == b"\x5a" * 100
    assert buf.read(None, 100) == b""


def test_closing_makes_every_use_raise_closed_error(live):
    with _host_buffer(64) as buf:
        buf.write(b"abc")
        assert not buf.closed
    assert buf.closed and live() == 0
    assert "closed" in repr(buf)
    for use in (
        lambda: len(buf),
        lambda: buf.nbytes,
        lambda: buf.write(b"x"),
        lambda: buf.read(1),
        lambda: buf.read_into(bytearray(1)),
        lambda: buf.numpy(),
        lambda: buf.view(),
        lambda: buf.__dlpack__(),
        lambda: buf.__dlpack_device__(),
        lambda: buf.fence(),
    ):
        with pytest.raises(gdr.ClosedError):
            use()
    buf.close()  # twice is fine


def test_numpy_view_is_the_memory_itself_and_holds_it(live):
    buf = _host_buffer(64)
    v = buf.numpy()
    assert v.dtype == np.uint8 and v.shape == (64,)
    v[3:6] = [1, 2, 3]
    buf.fence()
    assert buf.read(3, 3) == b"\x01\x02\x03"
    buf.write(b"\xff", 10)
    assert v[10] == 255
    f = buf.numpy("float32", (2, 4), offset=8)
    assert f.shape == (2, 4) and f.dtype == np.float32
    f[:] = 1.5
    assert np.frombuffer(buf.read(32, 8), np.float32).tolist() == [1.5] * 8
    buf.close()
    assert live() == 1, "the view holds the memory after close()"
    v[0] = 9  # still valid memory
    del buf
    gc.collect()
    assert live() == 1
    del v, f
    gc.collect()
    assert live() == 0


def test_numpy_view_bounds_and_types():
    buf = _host_buffer(64)
    with pytest.raises(gdr.BoundsError):
        buf.numpy("float64", 9)
    with pytest.raises(ValueError, match="whole number"):
        buf.numpy("float32", None, offset=2)
    with pytest.raises(ValueError, match="NumPy has no bfloat16"):
        buf.numpy("bfloat16")
    with pytest.raises(ValueError, match="unknown element type"):
        buf.numpy("float33")
    for dt in ("int16", "<i2", "i2", np.int16, np.dtype("int16")):
        assert buf.numpy(dt).dtype == np.int16, dt
    with pytest.raises(ValueError):
        buf.numpy("short")  # NumPy's C names are not taken
    with pytest.raises(ValueError, match="big-endian"):
        buf.numpy(np.dtype(">i4"))


def test_dlpack_to_numpy_sees_the_bytes_both_ways(live):
    buf = _host_buffer(4096)
    buf.write(bytes(range(256)) * 16)
    a = np.from_dlpack(buf)
    assert a.dtype == np.uint8 and a.shape == (4096,)
    assert a[:256].tolist() == list(range(256))
    a[0] = 77  # the array is the memory
    assert buf.read(1) == b"\x4d"
    assert buf.__dlpack_device__() == (1, 0)


def test_typed_views_export_their_type_shape_and_offset():
    buf = _host_buffer(4096)
    vals = np.arange(12, dtype=np.float32)
    buf.write(vals, 64)
    v = buf.view("float32", (3, 4), offset=64)
    assert v.shape == (3, 4) and v.dtype == "float32" and v.nbytes == 48 and v.offset == 64
    assert len(v) == 3 and "float32" in repr(v)
    a = np.from_dlpack(v)
    assert a.shape == (3, 4) and a.dtype == np.float32
    assert a.ravel().tolist() == vals.tolist()
    assert buf.view().shape == (4096,)
    scalar = buf.view("float32", (), offset=64)
    with pytest.raises(TypeError):
        len(scalar)
    assert np.from_dlpack(scalar).shape == () and float(np.from_dlpack(scalar)) == 0.0
    assert buf.view("int64", 3, offset=8).shape == (3,)
    with pytest.raises(gdr.BoundsError):
        buf.view("float64", 513)
    with pytest.raises(AttributeError):
        v.__cuda_array_interface__  # host memory has no device pointer
    with pytest.raises(AttributeError):
        buf.__cuda_array_interface__
    with pytest.raises(AttributeError):
        buf.device_ptr


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))),
]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DLManagedTensorVersioned._fields_ = [
    ("major", ctypes.c_uint32),
    ("minor", ctypes.c_uint32),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

_capi = ctypes.pythonapi
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_SetName.restype = ctypes.c_int
_capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


def test_dlpack_capsules_follow_the_protocol(live):
    buf = _host_buffer(1000)
    addr = np.from_dlpack(buf).ctypes.data
    v = buf.view("int16", (5, 7), offset=100)
    legacy = v.__dlpack__()
    assert _capi.PyCapsule_IsValid(legacy, b"dltensor") == 1
    t = DLManagedTensor.from_address(_capi.PyCapsule_GetPointer(legacy, b"dltensor")).dl_tensor
    assert t.data == addr + 100 and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (1, 0)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (0, 16, 1)
    assert t.ndim == 2 and [t.shape[i] for i in range(2)] == [5, 7]
    assert [t.strides[i] for i in range(2)] == [7, 1]

    versioned = v.__dlpack__(max_version=(1, 3))
    assert _capi.PyCapsule_IsValid(versioned, b"dltensor_versioned") == 1
    m = DLManagedTensorVersioned.from_address(
        _capi.PyCapsule_GetPointer(versioned, b"dltensor_versioned")
    )
    assert (m.major, m.minor, m.flags) == (1, 0, 0)
    assert m.dl_tensor.data == addr + 100 and m.dl_tensor.ndim == 2
    assert v.__dlpack__(max_version=(0, 8)) is not None  # an old consumer: legacy

    # A consumer renames the capsule and deletes the tensor itself, once.
    taken = buf.__dlpack__()
    p = _capi.PyCapsule_GetPointer(taken, b"dltensor")
    assert _capi.PyCapsule_SetName(taken, b"used_dltensor") == 0
    del buf, v
    gc.collect()
    assert live() == 1, "the capsules hold the memory"
    del legacy, versioned, taken  # the unconsumed ones delete their tensors
    gc.collect()
    assert live() == 1, "the consumed tensor is the consumer's to delete"
    mt = DLManagedTensor.from_address(p)
    mt.deleter(ctypes.cast(p, ctypes.POINTER(DLManagedTensor)))
    assert live() == 0


def test_dlpack_refuses_what_it_cannot_do():
    buf = _host_buffer(16)
    with pytest.raises(BufferError, match="without a copy"):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="device"):
        buf.__dlpack__(dl_device=(2, 0))
    assert buf.__dlpack__(dl_device=(1, 0), copy=False) is not None
    assert buf.__dlpack__(stream=None) is not None


@pytest.mark.parametrize("order", ["buffer first", "array first"])
def test_memory_goes_with_its_last_holder_in_either_order(order, live):
    buf = _host_buffer(1 << 16)
    buf.write(b"\x11" * 16)
    arr = np.from_dlpack(buf)
    view = buf.numpy()
    if order == "buffer first":
        del buf
        gc.collect()
        assert live() == 1
        assert arr[:16].tolist() == [0x11] * 16 and view[0] == 0x11
        del arr
        gc.collect()
        assert live() == 1
        del view
    else:
        del arr, view
        gc.collect()
        assert live() == 1
        buf.write(b"still mine")
        del buf
    gc.collect()
    assert live() == 0


def test_python_threads_copy_at_once_to_disjoint_ranges(live):
    buf = _host_buffer(16 << 20)
    n_threads, chunk = 8, 2 << 20
    errors = []

    def worker(i: int) -> None:
        try:
            for rep in range(5):
                data = rand_bytes(chunk - i, i * 10 + rep)
                buf.write(data, i * chunk)  # large: the GIL is let go meanwhile
                assert buf.read(len(data), i * chunk) == data
                small = rand_bytes(17, rep)
                buf.write(small, i * chunk + 3)
                assert buf.read(17, i * chunk + 3) == small
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    buf.close()


def test_close_while_another_thread_copies_keeps_the_memory_for_the_copy(live):
    buf = _host_buffer(64 << 20)
    data = bytes(64 << 20)
    done = threading.Event()
    failures = []

    def copier() -> None:
        try:
            for _ in range(20):
                buf.write(data)
        except gdr.ClosedError:
            pass  # closed between two copies: expected
        except Exception as e:
            failures.append(e)
        done.set()

    t = threading.Thread(target=copier)
    t.start()
    buf.close()
    t.join()
    assert done.is_set() and not failures, failures


def test_repr_len_and_properties():
    buf = _host_buffer(123)
    assert len(buf) == 123 == buf.nbytes
    assert repr(buf) == "<gdr.Buffer 123 bytes of host memory>"
    assert buf.device is None and not buf.closed


def test_the_benchmarks_rust_loop_makes_the_same_copies(live):
    """`_rust_copy_loop` (bench_vkgdr.py's Rust side) copies what `write`/`read_into` copy, k
    times, and returns a time; bad arguments raise before any copy."""
    from gdr._gdr import _rust_copy_loop

    buf = _host_buffer(8192)
    data = rand_bytes(1000, 44)
    buf.write(b"\xa5" * 8192)
    ns = _rust_copy_loop("write", buf, data, 3, 17)
    assert isinstance(ns, int) and ns > 0
    assert buf.read(1000, 17) == data
    assert buf.read(1, 16) == b"\xa5" and buf.read(1, 1017) == b"\xa5"
    out = np.full(1000, 0x5A, np.uint8)
    assert _rust_copy_loop("read", buf, out, 2, offset=17) > 0
    assert out.tobytes() == data
    for args, exc in [
        (("write", buf, data, 0), ValueError),  # no copies
        (("write", buf, data, (1 << 24) + 1), ValueError),
        (("sideways", buf, data, 1), ValueError),
        (("read", buf, b"immutable", 1), (BufferError, TypeError)),
        (("write", bytearray(8), data, 1), TypeError),  # not a gdr.Buffer
        (("write", buf, data, 1, 8192 - 999), gdr.BoundsError),
        (("write", buf, data, 1, -1), ValueError),
    ]:
        before = buf.read()
        with pytest.raises(exc):
            _rust_copy_loop(*args)
        assert buf.read() == before, args
    buf.close()
    with pytest.raises(gdr.ClosedError):
        _rust_copy_loop("write", buf, data, 1)
