"""Bad arguments raise what docs/python.md promises, on any machine: an int argument that is
not an int raises ``TypeError``, one out of range (negative, too large, ``threads`` outside
1..=1024) raises ``ValueError``, never ``OverflowError``, and every check comes before the GPU
is opened, so a machine without a GPU reports the bad argument, not the missing GPU. Uses of a
closed buffer (``len``, ``nbytes``, ``with``) raise ``ClosedError``. Needs no GPU."""

from __future__ import annotations

import pytest

import gdr
from gdr._gdr import _host_buffer

HUGE = 2**64  # one past the largest size_t
ADDR = 0x7F0000000000


def buf():
    return _host_buffer(4096)


# Each: a call with one bad int argument, and the argument's name as the message gives it.
OUT_OF_RANGE = {
    "write offset -1": (lambda: buf().write(b"x", -1), "offset"),
    "write offset 2**64": (lambda: buf().write(b"x", HUGE), "offset"),
    "read size -1": (lambda: buf().read(-1), "size"),
    "read offset -1": (lambda: buf().read(1, -1), "offset"),
    "read_into offset -1": (lambda: buf().read_into(bytearray(1), -1), "offset"),
    "numpy offset -1": (lambda: buf().numpy(offset=-1), "offset"),
    "numpy shape -1": (lambda: buf().numpy("uint8", (2, -1)), "shape"),
    "view offset -1": (lambda: buf().view(offset=-1), "offset"),
    "view shape -1": (lambda: buf().view("uint8", -1), "shape"),
    "dlpack max_version": (lambda: buf().__dlpack__(max_version=(-1, 0)), "max_version"),
    "dlpack dl_device": (lambda: buf().__dlpack__(dl_device=(1, -1)), "dl_device"),
    "host buffer size -1": (lambda: _host_buffer(-1), "size"),
    "pointer_device addr -1": (lambda: gdr.pointer_device(-1), "addr"),
    "pointer_device addr 2**64": (lambda: gdr.pointer_device(HUGE), "addr"),
    "Gpu device -1": (lambda: gdr.Gpu(-1), "device"),
    "open device -1": (lambda: gdr.open(-1), "device"),
    "alloc size -1": (lambda: gdr.alloc(-1), "size"),
    "alloc size 0": (lambda: gdr.alloc(0), "size"),
    "alloc device -1": (lambda: gdr.alloc(64, -1), "device"),
    "alloc align -64": (lambda: gdr.alloc(64, align=-64), "align"),
    "alloc align 3": (lambda: gdr.alloc(64, align=3), "align"),
    "pin addr -1": (lambda: gdr.pin(-1, 4096), "addr"),
    "pin size -1": (lambda: gdr.pin(ADDR, -1), "size"),
    "pin size 0": (lambda: gdr.pin(ADDR, 0), "size"),
    "pin device -1": (lambda: gdr.pin(ADDR, 4096, device=-1), "device"),
}


@pytest.mark.parametrize("case", OUT_OF_RANGE)
def test_out_of_range_ints_raise_value_error_naming_the_argument(case):
    call, name = OUT_OF_RANGE[case]
    with pytest.raises(ValueError) as e:
        call()
    assert not isinstance(e.value, gdr.GdrError), "an argument error, not gdr's"
    assert name in str(e.value), str(e.value)


NOT_INTS = {
    "alloc size '1'": lambda: gdr.alloc("1"),
    "alloc size 1.0": lambda: gdr.alloc(1.0),
    "alloc device '0'": lambda: gdr.alloc(64, "0"),
    "alloc align 64.0": lambda: gdr.alloc(64, align=64.0),
    "open device '0'": lambda: gdr.open("0"),
    "open device 0.0": lambda: gdr.open(0.0),
    "Gpu device '0'": lambda: gdr.Gpu("0"),
    "pin size '1'": lambda: gdr.pin(ADDR, "1"),
    "pin device '0'": lambda: gdr.pin(ADDR, 1, device="0"),
    "pointer_device '1'": lambda: gdr.pointer_device("1"),
    "write offset '0'": lambda: buf().write(b"x", "0"),
    "read size 1.5": lambda: buf().read(1.5),
    "read threads '2'": lambda: buf().read(1, threads="2"),
    "view shape '2'": lambda: buf().view("uint8", "2"),
}


@pytest.mark.parametrize("case", NOT_INTS)
def test_ints_of_the_wrong_type_raise_type_error_before_the_gpu_is_opened(case):
    with pytest.raises(TypeError) as e:
        NOT_INTS[case]()
    assert "must be" in str(e.value), str(e.value)


@pytest.mark.parametrize("threads", [0, -1, 1025, 2**64 - 1, HUGE])
def test_thread_counts_outside_1_to_1024_are_refused(threads):
    b = buf()
    for call in (
        lambda: b.write(b"x" * 100, threads=threads),
        lambda: b.read(100, threads=threads),
        lambda: b.read_into(bytearray(100), threads=threads),
    ):
        with pytest.raises(ValueError, match="threads must be an int from 1 to 1024"):
            call()


def test_thread_counts_at_the_bounds_are_taken():
    b = buf()
    for threads in (1, 1024):
        b.write(b"y" * 100, 3, threads=threads)
        assert b.read(100, 3, threads=threads) == b"y" * 100


@pytest.mark.parametrize("offset", [4096, 2**63 - 1, 2**63, 2**64 - 1])
def test_offsets_past_the_buffer_up_to_2_64_minus_1_are_bounds_errors(offset):
    # Offsets up to 2**63 - 1 take the copies' one-call path, larger ones the full check; both
    # must give the same answer: a valid int, outside the buffer.
    b = buf()
    b.write(b"k" * 8)
    for call in (
        lambda: b.write(b"x", offset),
        lambda: b.read(1, offset),
        lambda: b.read_into(bytearray(1), offset),
    ):
        with pytest.raises(gdr.BoundsError):
            call()
    assert b.read(8) == b"k" * 8  # nothing written


def test_an_int_subclass_is_taken_at_its_int_value():
    class Offset(int):
        def __index__(self) -> int:  # Python's own APIs take an int's value, not this
            return 0

    b = buf()
    b.write(b"abc", Offset(7))
    assert b.read(3, 7) == b"abc" and b.read(3, 0) == bytes(3)


def test_ints_of_other_int_types_are_taken():
    class Index:
        def __index__(self) -> int:
            return 5

    b = buf()
    b.write(b"z", Index())
    assert b.read(True, Index()) == b"z"  # bool is an int, as Python takes it
    assert b.view("uint8", (Index(),), offset=Index()).shape == (5,)


def test_a_closed_buffer_has_no_length_and_cannot_be_entered():
    b = buf()
    b.close()
    for use in (lambda: len(b), lambda: b.nbytes):
        with pytest.raises(gdr.ClosedError, match="the buffer is closed"):
            use()
    with pytest.raises(gdr.ClosedError):
        with b:
            pass
    with pytest.raises(ValueError):  # ClosedError is a ValueError, as for Python's files
        len(b)
    assert b.closed and "closed" in repr(b)
    b.close()  # closing again is allowed


def test_a_buffer_closed_by_its_with_block_cannot_be_entered_again():
    with buf() as b:
        assert len(b) == b.nbytes == 4096
    with pytest.raises(gdr.ClosedError):
        with b:
            pass
