"""GPU tests with CuPy: arrays over gdr memory (DLPack and __cuda_array_interface__) that see
what the CPU wrote and whose writes the CPU reads, byte-exact at odd sizes and offsets;
lifetimes in both orders; pins of arrays (gdr memory, gdr's allocator); threads. Skipped
without a GPU or CuPy (failed under GDR_REQUIRE_GPU=1)."""

from __future__ import annotations

import gc
import threading

import pytest

import gdr
import gdr.cupy

from conftest import (
    ODD_OFFSETS,
    ODD_SIZES,
    allocator_library_or_skip,
    gpu_test_module_needs,
    random_bytes,
    run_python,
)

np = gpu_test_module_needs("numpy")


def sync(cupy) -> None:
    cupy.cuda.Device().synchronize()


def test_cupy_reads_what_the_cpu_wrote_and_the_cpu_reads_what_cupy_wrote(gpu, cupy, live):
    with gpu.alloc((1 << 20) + 8192) as buf:
        whole = cupy.from_dlpack(buf)
        assert whole.dtype == cupy.uint8 and whole.size == len(buf)
        assert whole.data.ptr == buf.device_ptr and whole.device.id == gpu.device
        for i, size in enumerate(ODD_SIZES):
            for off in ODD_OFFSETS:
                data = random_bytes(size, i * 17 + off)
                buf.write(data, off)
                a = cupy.from_dlpack(buf.view("uint8", size, offset=off))
                assert a.data.ptr == buf.device_ptr + off
                assert cupy.asnumpy(a).tobytes() == data, (size, off)
                assert int(a.astype(cupy.int64).sum()) == sum(data), (size, off)
                other = random_bytes(size, i * 17 + off + 1)
                a[...] = cupy.asarray(np.frombuffer(other, np.uint8))
                sync(cupy)
                assert buf.read(size, off) == other, (size, off)
                del a
        del whole


def test_typed_views_and_the_cuda_array_interface(gpu, cupy, live):
    with gpu.alloc(1 << 16) as buf:
        vals = np.arange(1000, dtype=np.float64)
        buf.write(vals, 128)
        a = gdr.cupy.array(buf, "float64", (20, 50), offset=128)
        assert a.shape == (20, 50) and a.dtype == cupy.float64
        assert (cupy.asnumpy(a).ravel() == vals).all()
        a *= 3
        sync(cupy)
        back = np.empty(1000, np.float64)
        buf.read_into(back, 128)
        assert (back == vals * 3).all()
        c = cupy.asarray(buf)  # __cuda_array_interface__
        assert c.data.ptr == buf.device_ptr and c.size == len(buf)
        c[:3] = 4
        sync(cupy)
        assert buf.read(3) == b"\x04" * 3
        f = cupy.asarray(buf.view(np.float32, 16, offset=4))
        assert f.dtype == cupy.float32 and f.data.ptr == buf.device_ptr + 4
        del a, c, f


@pytest.mark.parametrize("order", ["buffer first", "array first"])
def test_memory_goes_with_its_last_holder(gpu, cupy, order, live):
    buf = gpu.alloc(1 << 20)
    buf.write(b"\x03" * (1 << 20))
    a = cupy.from_dlpack(buf)
    b = cupy.asarray(buf.view("int16"))
    if order == "buffer first":
        del buf
        gc.collect()
        assert live() == 1
        assert int(a.astype(cupy.int64).sum()) == 3 * (1 << 20)
        assert int(b[0]) == 0x0303
        a.fill(2)
        sync(cupy)
        del a, b
    else:
        del a, b
        gc.collect()
        sync(cupy)
        assert live() == 1
        assert buf.read(2) == b"\x03\x03"
        del buf
    gc.collect()
    assert live() == 0


def test_an_array_of_gdr_memory_pins_through_the_buffer(gpu, cupy, live):
    with gpu.alloc(1 << 20) as buf:
        a = gdr.cupy.array(buf, "int32", 256, offset=1024)
        with gdr.cupy.pin(a) as p:
            assert p.backend == "buffer" and p.obj is a and len(p) == 1024
            p.write(np.full(256, -1, np.int32))
            assert int(a.sum()) == -256
        del a


def test_a_default_pool_array_pins_or_says_why_not(gpu, cupy):
    a = cupy.zeros(1 << 20, dtype=cupy.uint8)
    try:
        p = gdr.pin(a)
    except gdr.PinError as e:
        assert "POSIX" in str(e) or "allocat" in str(e), str(e)
        return
    with p:
        p.write(b"\x08" * 10)
        assert int(a[:10].sum()) == 80


def test_pins_of_arrays_from_gdr_allocator(gpu, cupy):
    lib = allocator_library_or_skip()
    code = r"""
import gc, cupy, numpy as np, gdr, gdr.cupy, gdr.allocator
gdr.cupy.use_gdr_allocator()
lib = gdr.allocator.library()
for size in (1, 9, 4099, (1 << 20) + 1):
    a = cupy.zeros(size + 16, dtype=cupy.uint8)
    with gdr.pin(a) as p:
        data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
        p.write(data, 5)
        assert np.array_equal(cupy.asnumpy(a[5:5 + size]), data), size
        a[5:5 + size] = cupy.asarray(data[::-1].copy())
        cupy.cuda.Device().synchronize()
        assert p.read(size, 5) == data[::-1].tobytes(), size
live = lib.stats()["live_allocations"]
assert live > 0, live
# The array goes from the program before the pin: the pin holds it.
a = cupy.full(4096, 7, dtype=cupy.uint8)
p = gdr.pin(a)
del a
gc.collect()
assert p.read(3) == b"\x07" * 3
p.close()
print("OK")
"""
    out = run_python(code, GDR_ALLOC_LIB=lib)
    assert out.split() == ["OK"], out


def test_python_threads_with_arrays(gpu, cupy, live):
    errors = []

    def worker(i: int) -> None:
        try:
            with cupy.cuda.Device(gpu.device), gpu.alloc((1 << 20) + i) as buf:
                a = cupy.from_dlpack(buf)
                for rep in range(5):
                    data = random_bytes(len(buf), i * 10 + rep)
                    buf.write(data)
                    assert cupy.asnumpy(a).tobytes() == data
                    a.fill(rep)
                    sync(cupy)
                    assert buf.read(64, 100) == bytes([rep]) * 64
                del a
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
