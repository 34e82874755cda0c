"""Medians of alternated latency rounds, for the GPU scripts (ucx-gpu.sh, ucxx-gpu.sh).

Each line of a rounds file is `SIZE<TAB>SETUP<TAB>MICROSECONDS` (or `failed`), one per run; the
scripts run every setup at every size once per round, so that no setup always goes first."""

import collections
import statistics


def load(path):
    """(rounds, medians): rounds[size][setup] lists each round's figure (None where it failed);
    medians[size][setup] is their median, or None if any round failed."""
    rounds = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            size, setup, value = line.split()
            figure = None if value == "failed" else float(value)
            rounds.setdefault(int(size), {}).setdefault(setup, []).append(figure)
    medians = {
        size: {setup: (None if None in vs else statistics.median(vs)) for setup, vs in r.items()}
        for size, r in rounds.items()
    }
    return rounds, medians
