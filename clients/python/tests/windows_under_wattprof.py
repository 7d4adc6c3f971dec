"""Exercises the client; prints one JSON object with what it was told.

Run by wattprof's integration tests under `wattprof run` (and once
outside it, where every figure must be None).
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import wattprof  # noqa: E402


def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def figures(m):
    if m is None:
        return None
    return {"name": m.name, "energy_j": m.energy_j, "duration_s": m.duration_s,
            "raw": m.raw}


out = {"active": wattprof.active()}

with wattprof.window("train") as w:
    burn(0.3)
out["with"] = figures(w.measurement)
out["with_energy_j"] = w.energy_j


@wattprof.measure("step")
def step(n):
    burn(n)
    return n


step(0.1)
out["decorator"] = figures(step.last)

wattprof.begin_window("epoch")
burn(0.1)
out["zeus"] = figures(wattprof.end_window("epoch"))

try:
    wattprof.end_window("never-begun")
    out["refused"] = None
except wattprof.WattprofError as e:
    out["refused"] = str(e)

print(json.dumps(out))
