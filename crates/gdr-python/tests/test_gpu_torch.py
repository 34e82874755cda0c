"""GPU tests with PyTorch: tensors over gdr memory (DLPack and __cuda_array_interface__) that
see what the CPU wrote and whose writes the CPU reads, byte-exact at odd sizes and offsets;
lifetimes in both orders; pins of tensors (expandable segments, gdr memory, gdr's allocator);
threads. Skipped without a GPU or PyTorch (failed under GDR_REQUIRE_GPU=1)."""

from __future__ import annotations

import gc
import threading

import pytest

import gdr
import gdr.torch

from conftest import (
    ODD_OFFSETS,
    ODD_SIZES,
    allocator_library_or_skip,
    gpu_test_module_needs,
    random_bytes,
    run_python,
)

np = gpu_test_module_needs("numpy")


def host_tensor(torch, data: bytes):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def tensor_bytes(t) -> bytes:
    return t.cpu().numpy().tobytes()


def test_torch_reads_what_the_cpu_wrote_and_the_cpu_reads_what_torch_wrote(gpu, torch, live):
    with gpu.alloc((1 << 20) + 8192) as buf:
        whole = torch.from_dlpack(buf)
        assert whole.device == torch.device("cuda", gpu.device)
        assert whole.dtype == torch.uint8 and whole.numel() == len(buf)
        assert whole.data_ptr() == buf.device_ptr
        for i, size in enumerate(ODD_SIZES):
            for off in ODD_OFFSETS:
                data = random_bytes(size, i * 31 + off)
                buf.write(data, off)
                t = torch.from_dlpack(buf.view("uint8", size, offset=off))
                assert t.data_ptr() == buf.device_ptr + off
                assert tensor_bytes(t) == data, (size, off)
                # The GPU computes on it (a kernel, not only a copy).
                assert int(t.to(torch.int64).sum()) == sum(data), (size, off)
                other = random_bytes(size, i * 31 + off + 1)
                t.copy_(host_tensor(torch, other).to(t.device))
                torch.cuda.synchronize()
                assert buf.read(size, off) == other, (size, off)
                del t
        del whole


def test_typed_views_and_the_cuda_array_interface(gpu, torch, live):
    with gpu.alloc(1 << 16) as buf:
        vals = np.arange(1000, dtype=np.float32) * 0.5
        buf.write(vals, 64)
        t = gdr.torch.tensor(buf, torch.float32, (10, 100), offset=64)
        assert t.shape == (10, 100) and t.dtype == torch.float32
        assert torch.equal(t.cpu().flatten(), torch.from_numpy(vals))
        t.mul_(2)
        torch.cuda.synchronize()
        back = np.empty(1000, np.float32)
        buf.read_into(back, 64)
        assert (back == vals * 2).all()
        bf = torch.from_dlpack(buf.view("bfloat16", 8))
        assert bf.dtype == torch.bfloat16
        c = torch.as_tensor(buf, device="cuda")  # __cuda_array_interface__
        assert c.data_ptr() == buf.device_ptr and c.numel() == len(buf)
        c[:4] = 9
        torch.cuda.synchronize()
        assert buf.read(4) == b"\x09" * 4
        i64 = torch.as_tensor(buf.view("int64", 4, offset=8), device="cuda")
        assert i64.dtype == torch.int64 and i64.data_ptr() == buf.device_ptr + 8
        with pytest.raises(ValueError, match="multiple"):
            buf.view("float32", 4, offset=2)
        del t, bf, c, i64


@pytest.mark.parametrize("order", ["buffer first", "tensor first", "closed first"])
def test_memory_goes_with_its_last_holder(gpu, torch, order, live):
    buf = gpu.alloc(1 << 20)
    buf.write(b"\x5a" * (1 << 20))
    t = torch.from_dlpack(buf)
    c = torch.as_tensor(buf.view("int32"), device="cuda")
    if order == "buffer first":
        del buf
    elif order == "closed first":
        buf.close()
        with pytest.raises(gdr.ClosedError):
            buf.write(b"x")
    gc.collect()
    assert live() == 1
    assert int(t.to(torch.int64).sum()) == 0x5A * (1 << 20)
    assert int(c[0]) == 0x5A5A5A5A
    t.fill_(1)
    torch.cuda.synchronize()
    del t, c
    torch.cuda.synchronize()
    gc.collect()
    if order == "tensor first":
        assert live() == 1 and buf.read(2) == b"\x01\x01"
        del buf
    elif order == "closed first":
        del buf
    gc.collect()
    assert live() == 0


def test_the_cuda_array_interface_holds_a_closed_buffer_until_collected(gpu, torch, live):
    buf = gpu.alloc(4096)
    t = torch.as_tensor(buf, device="cuda")  # holds `buf`, not the memory
    buf.close()
    gc.collect()
    assert live() == 1
    t.fill_(3)
    torch.cuda.synchronize()
    del buf
    gc.collect()
    assert live() == 1, "the tensor holds the buffer object"
    del t
    gc.collect()
    assert live() == 0


def test_a_tensor_of_gdr_memory_pins_through_the_buffer(gpu, torch, live):
    with gpu.alloc(1 << 20) as buf:
        t = gdr.torch.tensor(buf, torch.float32, 1024, offset=4096)
        with gdr.torch.pin(t) as p:
            assert p.backend == "buffer" and p.obj is t and len(p) == 4096
            p.write(np.ones(1024, np.float32))
            assert float(t.sum()) == 1024.0
        del t


def test_a_default_allocator_tensor_pins_or_says_why_not(gpu, torch):
    t = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    try:
        p = gdr.pin(t)
    except gdr.PinError as e:
        # No gdrdrv and no dma-buf mmap here: only allocator memory can be pinned; the error
        # says what works instead.
        assert "POSIX" in str(e) or "allocat" in str(e), str(e)
        return
    with p:
        p.write(b"\x07" * 100, 5)
        torch.cuda.synchronize()
        assert int(t[5:105].sum()) == 700
        t[200:300] = 3
        torch.cuda.synchronize()
        assert p.read(100, 200) == b"\x03" * 100


PIN_ROUND_TRIP = r"""
import gc, sys, torch, numpy as np, gdr, gdr.torch
dev = torch.device("cuda", 0)
for size in (1, 7, 4097, (1 << 20) + 3):
    t = torch.zeros(size + 64, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    with gdr.pin(t) as p:
        assert p.backend in ("vulkan", "dmabuf", "gdrdrv", "buffer"), p.backend
        data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
        p.write(data, 3)
        assert np.array_equal(t[3:3 + size].cpu().numpy(), data), size
        t[3:3 + size] = torch.from_numpy(255 - data).to(dev)
        torch.cuda.synchronize()
        assert p.read(size, 3) == (255 - data).tobytes(), size
# The tensor is gone from the program before the pin: the pin holds it.
t = torch.full((4096,), 9, dtype=torch.uint8, device=dev)
torch.cuda.synchronize()
p = gdr.pin(t)
ptr = t.data_ptr()
del t
gc.collect()
assert p.read(4) == b"\x09" * 4 and p.obj.data_ptr() == ptr
u = torch.full((4096,), 1, dtype=torch.uint8, device=dev)   # cannot reuse p's memory
torch.cuda.synchronize()
assert p.read(4) == b"\x09" * 4 and u.data_ptr() != ptr
p.close()
# The pin goes first: the tensor is untouched and usable.
v = torch.full((4096,), 5, dtype=torch.uint8, device=dev)
q = gdr.pin(v)
q.write(b"\x06")
del q
gc.collect()
torch.cuda.synchronize()
assert int(v[0]) == 6 and int(v[1]) == 5
print("OK", gdr._gdr._live_memories())
"""


def test_pins_of_expandable_segment_tensors(gpu, torch):
    out = run_python(PIN_ROUND_TRIP, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    assert out.split() == ["OK", "0"], out


def test_pins_of_tensors_from_gdr_allocator(gpu, torch):
    lib = allocator_library_or_skip()
    code = (
        "import gdr.torch, gdr.allocator; gdr.torch.use_gdr_allocator()\n"
        + PIN_ROUND_TRIP
        + "\nassert gdr.allocator.library().stats()['live_allocations'] > 0\n"
    )
    out = run_python(code, GDR_ALLOC_LIB=lib)
    assert out.split()[:2] == ["OK", "0"], out


def test_python_threads_with_tensors(gpu, torch, live):
    errors = []

    def worker(i: int) -> None:
        try:
            torch.cuda.set_device(gpu.device)
            with gpu.alloc((1 << 20) + i) as buf:
                t = torch.from_dlpack(buf)
                for rep in range(5):
                    data = random_bytes(len(buf), i * 10 + rep)
                    buf.write(data)
                    assert tensor_bytes(t) == data
                    t.fill_(rep)
                    torch.cuda.synchronize()
                    assert buf.read(64, 100) == bytes([rep]) * 64
                del t
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
