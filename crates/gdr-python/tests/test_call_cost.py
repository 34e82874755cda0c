"""bench/call_cost.py, the measure of a Python call's cost: it runs without a GPU, checks the
bytes of every mode before timing it, and refuses bad counts."""

import os
import re
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "bench", "call_cost.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=120)


def test_every_mode_is_timed_over_the_empty_loop():
    r = run("--calls", "2000", "--rounds", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("per call, ns, over the empty loop")
    figures = dict(re.fullmatch(r"\s+(\w+)\s+(-?[\d.]+)", l).groups() for l in lines[1:])
    want = {"write", "write_kw", "read_into", "read", "len"}
    try:
        import numpy  # noqa: F401

        want |= {"write_np", "read_into_np"}
    except ImportError:
        pass
    assert set(figures) == want
    # A call costs something: at least a nanosecond over an empty iteration, on any machine.
    assert all(float(v) > 1 for v in figures.values()), figures


@pytest.mark.parametrize("bad", [["--calls", "0"], ["--rounds", "0"], ["--mode", "nothing"]])
def test_bad_counts_and_modes_are_refused(bad):
    r = run(*bad)
    assert r.returncode == 2 and "error" in r.stderr, (r.returncode, r.stderr)
