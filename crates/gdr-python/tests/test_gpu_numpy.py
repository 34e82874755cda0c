"""GPU tests of gdr alone, with NumPy: copies through the mapping and the auto copier, checked
against each other (the auto copier uses the copy engine from a few KiB, so a write through the
mapping read back by the copy engine proves the bytes reached GPU memory), NumPy views, errors,
closing and threads. Skipped without a GPU (failed under GDR_REQUIRE_GPU=1)."""

from __future__ import annotations

import gc
import threading

import pytest

import gdr

from conftest import ODD_OFFSETS, ODD_SIZES, gpu_test_module_needs, random_bytes

np = gpu_test_module_needs("numpy")


@pytest.fixture
def auto(gpu):
    return gpu.auto_copier()


def test_mapping_round_trips_are_byte_exact(gpu, live):
    with gpu.alloc((1 << 20) + 8192) as buf:
        assert buf.device == gpu.device and buf.device_ptr % 64 == 0
        for i, size in enumerate(ODD_SIZES):
            for off in ODD_OFFSETS:
                data = random_bytes(size, i * 1000 + off)
                guard = random_bytes(size + 2, -i)
                buf.write(guard, off)
                buf.write(data, off + 1)
                assert buf.read(size, off + 1) == data, (size, off)
                out = np.empty(size, np.uint8)
                assert buf.read_into(out, off + 1) == size
                assert out.tobytes() == data, (size, off)
                edges = buf.read(size + 2, off)
                assert edges[:1] == guard[:1] and edges[-1:] == guard[-1:], (size, off)


def test_what_the_mapping_writes_the_copy_engine_reads_and_back(gpu, auto, live):
    with gpu.alloc(64 << 20) as buf:
        for size in (4096 + 3, 64 << 10, (1 << 20) + 1, 16 << 20, (64 << 20) - 7):
            data = random_bytes(size, size)
            off = 7
            buf.write(data, off)
            out = bytearray(size)
            auto.read_into(buf, out, off)
            assert bytes(out) == data, size
            other = random_bytes(size, size + 1)
            auto.write(buf, other, off)
            assert buf.read(size, off, threads=4) == other, size
            assert auto.read(buf, size, off) == other


@pytest.mark.parametrize("threads", [2, 4, 8])
def test_parallel_mapping_copies_are_byte_exact(gpu, threads, live):
    with gpu.alloc(32 << 20) as buf:
        for size in (65537, (4 << 20) + 3, 31 << 20):
            data = random_bytes(size, size + threads)
            buf.write(data, 1, threads=threads)
            assert buf.read(size, 1, threads=threads) == data
            assert buf.read(size, 1) == data


def test_auto_copier_paths_and_calibration(auto):
    for direction in ("write", "read"):
        for size in (1, 8, 4096, 1 << 20, 256 << 20):
            p = auto.path(direction, size)
            assert p == "mapping" or p == "copy engine" or p.startswith("mapping x"), p
    cal = auto.calibration()
    assert len(cal["to_gpu"]) == len(cal["from_gpu"]) >= 29 and cal["points"]
    with pytest.raises(ValueError):
        auto.path("sideways", 8)
    assert "AutoCopier" in repr(auto)


def test_auto_copier_takes_only_gdr_buffers(gpu, auto):
    with pytest.raises(TypeError):
        auto.write(bytearray(8), b"x")
    host = gdr._gdr._host_buffer(1 << 17)
    # Below and above the size from which a copy lets go of the interpreter: the two take the
    # buffer's memory two ways (under its lock, or holding a reference).
    for n in (8, 1 << 17):
        with pytest.raises(TypeError, match="gdr allocated"):
            auto.write(host, b"x" * n)
        with pytest.raises(TypeError, match="gdr allocated"):
            auto.read_into(host, bytearray(n))
    with gpu.alloc(64) as buf:
        with pytest.raises(gdr.BoundsError):
            auto.write(buf, b"x" * 65)
        with pytest.raises(gdr.BoundsError):
            auto.read_into(buf, bytearray(8), 60)
    with gpu.alloc(1 << 17) as big:
        with pytest.raises(gdr.BoundsError):
            auto.write(big, b"x" * (1 << 17), 1)
        with pytest.raises(gdr.BoundsError):
            auto.read_into(big, bytearray(1 << 17), 1)
    for b, n in ((buf, 8), (big, 1 << 17)):
        out = bytearray(b"\xa5" * n)
        with pytest.raises(gdr.ClosedError):
            auto.write(b, b"x" * n)
        with pytest.raises(gdr.ClosedError):
            auto.read_into(b, out)
        with pytest.raises(gdr.ClosedError):
            auto.read(b, n)
        assert out == b"\xa5" * n  # nothing was read into it


def test_auto_copier_small_copies_are_byte_exact_at_odd_offsets(gpu, auto, live):
    """The copies made attached, under the buffer's lock (below 64 KiB), and the first ones
    made detached, checked against the mapping both ways, with the bytes beside them kept."""
    with gpu.alloc(1 << 18) as buf:
        for i, size in enumerate((1, 8, 63, 4096 + 3, (64 << 10) - 1, 64 << 10, (64 << 10) + 1)):
            for off in (0, 1, 4093):
                guard = random_bytes(size + 2, -size - off)
                buf.write(guard, off)
                data = random_bytes(size, i * 7 + off)
                auto.write(buf, data, off + 1)
                back = buf.read(size + 2, off)
                assert back[1:-1] == data and back[:1] == guard[:1], (size, off)
                assert back[-1:] == guard[-1:], (size, off)
                other = random_bytes(size, i * 7 + off + 1)
                buf.write(other, off + 1)
                out = np.full(size + 2, 0x5A, np.uint8)
                assert auto.read_into(buf, out[1:-1], off + 1) == size
                assert out[1:-1].tobytes() == other, (size, off)
                assert out[0] == 0x5A and out[-1] == 0x5A, (size, off)


def test_numpy_view_writes_reach_the_gpu_and_reads_see_it(gpu, auto, live):
    with gpu.alloc(1 << 16) as buf:
        v = buf.numpy("float32")
        v[:] = np.arange(v.size, dtype=np.float32)
        buf.fence()
        back = np.empty(v.size, np.float32)
        auto.read_into(buf, back)  # the copy engine, not the mapping
        assert (back == np.arange(v.size, dtype=np.float32)).all()
        buf.write(np.full(16, 7, np.int32), 64)
        assert buf.numpy("int32", 16, offset=64).tolist() == [7] * 16
        del v


def test_memory_outlives_close_while_a_numpy_view_holds_it(gpu, live):
    buf = gpu.alloc(4096)
    buf.write(b"\x42" * 4096)
    v = buf.numpy()
    buf.close()
    assert live() == 1
    assert v[4095] == 0x42
    del buf
    gc.collect()
    assert live() == 1
    del v
    gc.collect()
    assert live() == 0


def test_bad_requests_raise_typed_errors(gpu):
    with pytest.raises(ValueError):
        gpu.alloc(0)
    with pytest.raises(ValueError):
        gpu.alloc(64, align=3)
    with pytest.raises(gdr.OutOfMemoryError):
        gpu.alloc(1 << 50)
    host = np.zeros(4096, np.uint8)
    with pytest.raises(gdr.PinError):
        gpu.pin(host.ctypes.data, 4096)  # host memory is not CUDA device memory
    with pytest.raises(TypeError):
        gpu.pin(host)
    with gpu.alloc(100) as buf:
        with pytest.raises(gdr.BoundsError):
            buf.write(b"x" * 101)
        with pytest.raises(gdr.BoundsError):
            buf.read(1, 100)
    with pytest.raises(gdr.ClosedError):
        buf.read(1)


def test_a_pin_of_gdr_memory_maps_it_through_the_buffer(gpu, live):
    with gpu.alloc(1 << 20) as buf:
        view = buf.view("uint8", 1000, offset=4096)
        with gdr.pin(view) as p:
            assert p.backend == "buffer" and p.device_ptr == buf.device_ptr + 4096
            assert len(p) == 1000 and p.obj is view
            p.write(b"pinned", 10)
            assert buf.read(6, 4096 + 10) == b"pinned"
            buf.write(b"buffer", 4096 + 20)
            assert p.read(6, 20) == b"buffer"
            with pytest.raises(gdr.BoundsError):
                p.write(b"x", 1000)
        assert p.closed
        with pytest.raises(gdr.ClosedError):
            p.read(1)
        with gpu.pin(buf.device_ptr + 64, 64) as q:
            assert q.obj is None and q.pinned_range == (buf.device_ptr + 64, 64)


def test_python_threads_copy_at_once(gpu, auto, live):
    """Eight threads, each on its own range of one buffer and on a buffer of its own, with
    both copy kinds; large copies let go of the interpreter, so they overlap."""
    shared = gpu.alloc(8 * (4 << 20))
    errors = []

    def worker(i: int) -> None:
        try:
            own = gpu.alloc((2 << 20) + i)
            for rep in range(4):
                for size in (1 + i, 4096 + i, (2 << 20) + i):
                    data = random_bytes(size, i * 100 + rep)
                    shared.write(data, i * (4 << 20))
                    assert auto.read(shared, size, i * (4 << 20)) == data
                    auto.write(own, data)
                    assert own.read(size) == data
            own.close()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    shared.close()


def test_gpu_facts(gpu):
    assert gdr.device_count() >= 1
    assert gpu.name and gpu.bus_id.count(":") == 2
    free, total = gpu.mem_info()
    assert 0 < free <= total
    assert gdr.open(0) is gpu and f"Gpu {gpu.device}" in repr(gpu)
    info = gdr.info()
    assert info["gpus"] and info["gpus"][0]["bus_id"]
    try:
        backend, why = gpu.pin_backend()
    except gdr.UnavailableError as e:  # no pinning backend on this host: it says why
        assert "no pinning backend" in str(e)
    else:
        assert backend in ("gdrdrv", "dmabuf", "vulkan") and why


def test_the_benchmarks_rust_loop_copies_through_the_auto_copier(gpu, auto, live):
    """`_rust_copy_loop` with `auto=` (bench_vkgdr.py's Rust side of the auto copier) copies
    what `auto.write`/`read_into` copy, checked through the other path."""
    from gdr._gdr import _rust_copy_loop

    with gpu.alloc(8 << 20) as buf:
        for size in (8, 4096 + 3, (1 << 20) + 1, 4 << 20):
            data = np.frombuffer(random_bytes(size, size + 5), np.uint8)
            assert _rust_copy_loop("write", buf, data, 2, 9, auto=auto) > 0
            assert buf.read(size, 9, threads=4) == data.tobytes(), size
            out = np.full(size, 0xEE, np.uint8)
            assert _rust_copy_loop("read", buf, out, 2, 9, auto=auto) > 0
            assert out.tobytes() == data.tobytes(), size
        with pytest.raises(gdr.BoundsError):
            _rust_copy_loop("read", buf, bytearray(16), 1, (8 << 20) - 8, auto=auto)
