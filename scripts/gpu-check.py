#!/usr/bin/env python3
"""wattprof's check for a machine with an NVIDIA GPU: one script beside a
wattprof binary, PyTorch already installed, no network, no Rust.

    python3 gpu-check.py --wattprof ./wattprof [--out DIR] [--quick] [--budget-s 470]

One call takes at most --budget-s (470 s: under 8 minutes with the last
step's stop), on GPU 0, and never changes a GPU setting. The figures that
matter most come first: by about 2 minutes in on an H100 or H200
(estimated, see `Check.plan`), well within the first 5:

  gpu state      clocks, temperature, throttle reasons, power limit,
                 persistence, compute and MIG mode at the start (recorded);
                 at the end, the settings again: unchanged (bound)
  calibrate      `wattprof calibrate --gpu-only --step 5s`: the GPU's idle
                 and held power, the documented way, into DIR/host-model.json,
                 which the later `run`s read (`--host-model`)
  training job   a small CNN on synthetic images (DataLoader, 4 workers,
                 bf16 autocast, fixed steps), alone and under `wattprof run`,
                 in turns: steps/s under run / alone >= 0.97; the GPU
                 domain's attributed + idle + unattributed = measured within
                 1e-6 J; the tree >= 99% of (measured - idle); whether idle
                 came from the host model (recorded)
  time-slicing   A continuous and B at 50% duty (500 of 1,000 ms), each in
                 its own context, under `run --interval 1s`: their rates
                 alone, then together, give each one's GPU time; wattprof's
                 split of the dynamic GPU energy (held power shared equally
                 left out) within 2 points of it
  context at 1 s a job that opens its context within 1 s of `run`'s start
                 and works ~8 s: its GPU J within 2% of
                 (measured - calibrated idle W x wall)
  what a sample means
                 one process at 100/50/25% duty, fine (20-40 ms) and coarse
                 (600-1,200 ms) periods, timed with CUDA events, against
                 NVML's per-process samples polled every 100 ms: each
                 phase's mean over the driver's periods, relative to the
                 100% phase's, within 0.10 of the true relative duty (raw
                 samples kept)
  holder physics steady power (NVML's readings over each phase's later half)
                 of nothing, a holder alone, busy + holder, busy alone: a
                 holder beside busy work adds under 20% of the held power
                 (wattprof's model: the held power is paid once); the
                 calibrated idle and held W within 5% of these
  short jobs     a 0.3 s burst between two 1 s reads gets > 0 GPU J; a job
                 ending mid-interval gets > 0 GPU J in the interval it ended in
                 (on the stub the burst falls between reads or not, by
                 wattprof's start: where it does not, it passes anyway)
  pid namespace  the GPU job under `unshare --pid --fork --mount-proc`:
                 the tree >= 95% of (measured - idle)
  mps            only where `nvidia-cuda-mps-control -d` starts as it is
                 (else skipped, said why); two clients 2:1 in time (on the
                 stub, at 60% and 30% SM at once): their dynamic GPU J 2:1
                 within 5%; the daemon always stopped
  nvml           NVML as it is: the counter's update period, NOT_FOUND at
                 100 ms, sample timestamps, samples that cannot be true
  counter vs instant power
                 the energy counter against NVML_FI_DEV_POWER_INSTANT
                 integrated at 100 Hz over 30 s of load, within 5%
  two processes 2:1
                 turns 200/100 ms under `run` at 1 s and 100 ms: GPU J
                 against busy time within 10%
  idle and held power
                 what wattprof learns with no host model (within 2% and 5%
                 of the steady power), and what a holder beside a busy
                 process is charged (within 20% of half the held power)
  overhead       a fixed PyTorch job's GPU time under `run` / alone, <= 1.02

Each figure rewrites DIR/gpu-check.json (and .txt), `complete` false
until the last step, so a run cut short keeps what it measured; `steps`
gives each step's start and length. A step whose estimate no longer fits
the budget, or that the deadline cuts, is recorded as skipped, not failed.
The exit status is 0 when none failed. The recordings, DIR/host-model.json
and the sample-meaning step's raw samples (in the JSON's `raw`) are kept.

`--stub LIB` runs the same steps against wattprof's NVML stand-in
(tests/nvml-stub, which is also the CUDA stand-in `calibrate` opens a
context with) with stand-in loads (no GPU, no PyTorch): the script writes
the stub's scenario for each step, so what the "GPU" does is known. The
suite runs it so with --quick (tests/tests/gpu_check.rs), in about 2
minutes on 2 CPUs; `cargo xtask gpu-check --stub [--quick]` too.
"""

import argparse
import ctypes
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

NVML_SUCCESS = 0
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_FI_DEV_POWER_INSTANT = 186

# The stand-in GPU: a real-looking UUID (the host model and the CUDA
# stand-in match GPUs by UUID), and the draw every host-model step shares
# with `calibrate`'s scenario: 31.7 W idle, 22.3 W held, 1.5 W per SM %.
STUB_GPU = "gpu name=Stub-GPU uuid=GPU-6a3c0f0e-1b2d-4c5e-8f90-0123456789ab energy=counter sm_window_ms=2000"
STUB_LOAD = "load=31700:22300:1500"
STUB_IDLE_W, STUB_HELD_W = 31.7, 22.3

# Time-slicing: B works 500 ms of every 1,000. On the stub, whose driver
# samples every 250 ms there, on the stub's clock: any 1 s interval then
# holds two periods of B's work and two without.
SLICE_ON_S, SLICE_CYCLE_S = 0.5, 1.0

# What a sample means: (name, duty, period s; 0: continuous). Every period
# divides 1.2 s, so phases 1.2 s long start on a period on the stub's clock.
DUTY_PHASES = [("100%", 1.0, 0.0), ("50% fine", 0.5, 0.02), ("50% coarse", 0.5, 0.6),
               ("25% fine", 0.25, 0.04), ("25% coarse", 0.25, 1.2)]

THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap",
                 0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal",
                 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks"}
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


class ProcessSample(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class FieldValue(ctypes.Structure):
    _fields_ = [
        ("fieldId", ctypes.c_uint),
        ("scopeId", ctypes.c_uint),
        ("timestamp", ctypes.c_longlong),
        ("latencyUsec", ctypes.c_longlong),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_ulonglong),
    ]


class Nvml:
    """The few NVML calls the check makes, through ctypes (no pynvml).
    Closed after use (nvmlShutdown): NVML counts its inits, and the stub
    reads its scenario afresh only at an init with none open."""

    def __init__(self, lib):
        self.lib = ctypes.CDLL(lib)
        self.check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.dev = ctypes.c_void_p()
        self.check(self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.dev)), "handle")

    def close(self):
        self.lib.nvmlShutdown()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    @staticmethod
    def check(rc, what):
        if rc != NVML_SUCCESS:
            raise RuntimeError(f"NVML {what}: error {rc}")

    def text(self, fn, *args):
        buf = ctypes.create_string_buffer(96)
        rc = fn(*args, buf, ctypes.c_uint(96))
        return buf.value.decode(errors="replace") if rc == NVML_SUCCESS else f"error {rc}"

    def name(self):
        return self.text(self.lib.nvmlDeviceGetName, self.dev)

    def uuid(self):
        return self.text(self.lib.nvmlDeviceGetUUID, self.dev)

    def driver(self):
        return self.text(self.lib.nvmlSystemGetDriverVersion)

    def energy_mj(self):
        mj = ctypes.c_ulonglong()
        self.check(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(mj)), "energy")
        return mj.value

    def power_w(self):
        """NVML's power reading (on Ampere and later a mean over the last
        second), W."""
        mw = ctypes.c_uint()
        self.check(self.lib.nvmlDeviceGetPowerUsage(self.dev, ctypes.byref(mw)), "power")
        return mw.value / 1e3

    def instant_mw(self):
        v = FieldValue(fieldId=NVML_FI_DEV_POWER_INSTANT)
        self.check(self.lib.nvmlDeviceGetFieldValues(self.dev, 1, ctypes.byref(v)), "field values")
        if v.nvmlReturn != NVML_SUCCESS:
            raise RuntimeError(f"NVML_FI_DEV_POWER_INSTANT: error {v.nvmlReturn}")
        # valueType 1 (unsigned int) or 2 (unsigned long): the low word.
        return float(v.value & 0xFFFFFFFF if v.valueType == 1 else v.value)

    def samples(self, last_seen):
        """(rc, samples) since last_seen, a count race retried."""
        for _ in range(4):
            count = ctypes.c_uint(0)
            rc = self.lib.nvmlDeviceGetProcessUtilization(
                self.dev, None, ctypes.byref(count), ctypes.c_ulonglong(last_seen))
            if rc != NVML_ERROR_INSUFFICIENT_SIZE:
                return rc, []
            buf = (ProcessSample * count.value)()
            rc = self.lib.nvmlDeviceGetProcessUtilization(
                self.dev, buf, ctypes.byref(count), ctypes.c_ulonglong(last_seen))
            if rc == NVML_SUCCESS:
                return rc, list(buf[: count.value])
        return rc, []

    def read(self, fn, *args, out=ctypes.c_uint):
        """One getter's value, or 'error N' / 'no such call': a state read
        that fails is recorded, never fatal."""
        try:
            f = getattr(self.lib, fn)
        except AttributeError:
            return "no such call"
        v = out()
        rc = f(self.dev, *args, ctypes.byref(v))
        return v.value if rc == NVML_SUCCESS else f"error {rc}"

    def state(self):
        """The GPU's state: clocks, temperature, throttle reasons, power
        limit, persistence, compute and MIG mode (read only)."""
        s = {"sm_clock_mhz": self.read("nvmlDeviceGetClockInfo", 1),
             "mem_clock_mhz": self.read("nvmlDeviceGetClockInfo", 2),
             "temperature_c": self.read("nvmlDeviceGetTemperature", 0)}
        # Renamed in driver 535 (the old name stays, deprecated).
        r = self.read("nvmlDeviceGetCurrentClocksEventReasons", out=ctypes.c_ulonglong)
        if not isinstance(r, int):
            r = self.read("nvmlDeviceGetCurrentClocksThrottleReasons", out=ctypes.c_ulonglong)
        s["throttle_reasons"] = (f"{r:#x} " + ",".join(n for b, n in THROTTLE_BITS.items() if r & b)
                                 ).strip() if isinstance(r, int) else r
        lim = self.read("nvmlDeviceGetEnforcedPowerLimit")
        s["power_limit_w"] = lim / 1e3 if isinstance(lim, int) else lim
        s["persistence_mode"] = self.read("nvmlDeviceGetPersistenceMode", out=ctypes.c_int)
        cm = self.read("nvmlDeviceGetComputeMode", out=ctypes.c_int)
        s["compute_mode"] = COMPUTE_MODES.get(cm, cm) if isinstance(cm, int) else cm
        try:
            cur, pend = ctypes.c_uint(), ctypes.c_uint()
            rc = self.lib.nvmlDeviceGetMigMode(self.dev, ctypes.byref(cur), ctypes.byref(pend))
            s["mig_mode"] = f"current {cur.value}, pending {pend.value}" if rc == NVML_SUCCESS else f"error {rc}"
        except AttributeError:
            s["mig_mode"] = "no such call"
        return s


# The settings the check must leave as they were (the rest drift).
SETTINGS = ("power_limit_w", "persistence_mode", "compute_mode", "mig_mode")


# ---------------------------------------------------------------- loads ---

def torch_device():
    import torch  # noqa: PLC0415 (PyTorch only where the GPU is)

    torch.cuda.init()
    return torch, torch.device("cuda:0")


def gpu_work(seconds, stub):
    """Keeps the GPU busy for `seconds` (its own clock); the busy time."""
    start = time.monotonic()
    if stub:
        time.sleep(seconds)
        return seconds
    torch, dev = torch_device()
    a = torch.randn(4096, 4096, device=dev)
    b = torch.randn(4096, 4096, device=dev)
    while time.monotonic() - start < seconds:
        for _ in range(4):
            a = (a @ b).tanh_()
        torch.cuda.synchronize()
    return time.monotonic() - start


def sleep_until(t):
    """Sleeps until monotonic time `t`."""
    time.sleep(max(0.0, t - time.monotonic()))


def unix_of(t_mono):
    """The wall-clock time of monotonic time `t_mono` (their offset now)."""
    return time.time() + (t_mono - time.monotonic())


def emit(**kw):
    print(json.dumps(kw), flush=True)


class SyntheticBatches:
    """The training job's data set: batch i of random 64x64 images (bytes)
    and labels, made on the CPU; at module level, so a DataLoader worker
    gets it whatever its start method."""

    def __init__(self, n, batch):
        self.n, self.batch = n, batch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch  # noqa: PLC0415

        g = torch.Generator().manual_seed(i)
        return (torch.randint(0, 256, (self.batch, 3, 64, 64), dtype=torch.uint8, generator=g),
                torch.randint(0, 100, (self.batch,), generator=g))


def train(steps, stub):
    """The training job: a small CNN on synthetic 64x64 images (bytes, as
    decoded images are), made on the CPU by a DataLoader's 4 workers (one
    batch an item: cheap enough that the GPU sets the pace, about 5 ms a
    step on an H100), bf16 autocast, SGD; a fixed number of steps after 30
    of warm-up. Its rate is timed over the steps, not the process (CUDA's
    and the workers' start-up is the same alone and under wattprof). The
    stand-in: steps of 10 ms, mostly waiting (as for the GPU), no workers."""
    warm = 30
    if stub:
        x, t = 0, time.monotonic()
        for n in range(warm + steps):
            if n == warm:
                t = time.monotonic()
            for i in range(2000):
                x += i * i
            time.sleep(0.01)
        emit(pid=os.getpid(), steps=steps, steps_per_s=steps / (time.monotonic() - t))
        return
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415

    def block(cin, cout, stride):
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    dev = torch.device("cuda:0")
    model = nn.Sequential(*block(3, 128, 1), *block(128, 256, 2), *block(256, 256, 1),
                          *block(256, 512, 2), *block(512, 512, 1),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 100))
    model = model.to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # Workers forked (Linux's default before Python 3.14): their start
    # falls in the warm-up, which is not timed.
    loader = torch.utils.data.DataLoader(SyntheticBatches(steps + warm, 128), batch_size=None, num_workers=4,
                                         pin_memory=True, prefetch_factor=4, multiprocessing_context="fork")
    t = time.monotonic()
    for i, (x, y) in enumerate(loader):
        if i == warm:
            torch.cuda.synchronize()
            t = time.monotonic()
        x = x.to(dev, non_blocking=True).float().div_(255).to(memory_format=torch.channels_last)
        y = y.to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    emit(pid=os.getpid(), steps=steps, steps_per_s=steps / (time.monotonic() - t), loss=float(loss))


def matmul_step(torch, a, c):
    """One step of the time-slicing load: 4 bf16 4096² matmuls, waited for."""
    for _ in range(4):
        torch.mm(a, a, out=c)
    torch.cuda.synchronize()


def slice_one(role, t0, ta, tb, tt, stub):
    """One of the two time-slicing processes. A works continuously from t0
    for ta s (alone: B holds its context idle), waits tb s, then works
    through the together phase; B works its duty cycle in the tb s after
    that (alone), then through the together phase. Each counts its steps
    in 10 ms bins, so the check sums them over exactly the intervals it
    compares."""
    bin_s = 0.01
    end = t0 + ta + tb + tt
    if stub:
        sleep_until(end)
        emit(role=role, pid=os.getpid())
        return
    torch, dev = torch_device()
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    matmul_step(torch, a, c)
    late = max(0.0, time.monotonic() - t0)
    bins = [0] * (int((end - t0) / bin_s) + 2)

    def work(until):
        busy = 0.0
        while (now := time.monotonic()) < until:
            stop = until
            if role == "B":
                phase = (now - t0) % SLICE_CYCLE_S
                if phase >= SLICE_ON_S:
                    time.sleep(min(SLICE_CYCLE_S - phase, until - now))
                    continue
                stop = min(until, now + SLICE_ON_S - phase)
            s = time.monotonic()
            while time.monotonic() < stop:
                matmul_step(torch, a, c)
                bins[min(len(bins) - 1, int((time.monotonic() - t0) / bin_s))] += 1
            busy += time.monotonic() - s
        return busy

    sleep_until(t0)
    if role == "A":
        alone_s = work(t0 + ta)
        sleep_until(t0 + ta + tb)
    else:
        sleep_until(t0 + ta)
        alone_s = work(t0 + ta + tb)
    alone_steps = sum(bins)
    work(end)
    emit(role=role, pid=os.getpid(), alone_steps=alone_steps, alone_s=alone_s, bin_s=bin_s,
         late_s=round(late, 3), bins=bins)


def duty_phases(t0, length, stub):
    """What a sample means: this process at each duty of DUTY_PHASES for
    `length` s from t0, its GPU busy time timed with CUDA events (bursts of
    back-to-back matmuls, their count from the time one takes)."""
    t0_unix = unix_of(t0)
    out = []
    if stub:
        for i, (name, duty, period) in enumerate(DUTY_PHASES):
            sleep_until(t0 + (i + 1) * length)
            # The stand-in's truth is the scenario's.
            out.append({"name": name, "duty": duty, "period_s": period,
                        "start_unix": t0_unix + i * length, "end_unix": t0_unix + (i + 1) * length,
                        "busy_s": duty * length})
        emit(pid=os.getpid(), phases=out)
        return
    torch, dev = torch_device()
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]

    def burst(k):
        ev[0].record()
        for _ in range(k):
            torch.mm(a, a, out=c)
        ev[1].record()
        ev[1].synchronize()
        return ev[0].elapsed_time(ev[1]) / 1e3

    burst(10)
    ms = burst(50) / 50 * 1e3
    for i, (name, duty, period) in enumerate(DUTY_PHASES):
        start, end = t0 + i * length, t0 + (i + 1) * length
        sleep_until(start)
        busy = 0.0
        while (now := time.monotonic()) < end:
            if period == 0:
                busy += burst(max(1, int(min(0.05, end - now) * 1e3 / ms)))
                continue
            cycle = start + int((now - start) / period) * period
            on_end = min(cycle + duty * period, end)
            if now < on_end:
                busy += burst(max(1, round((on_end - now) * 1e3 / ms)))
            sleep_until(min(cycle + period, end))
        out.append({"name": name, "duty": duty, "period_s": period, "start_unix": t0_unix + i * length,
                    "end_unix": t0_unix + (i + 1) * length, "busy_s": busy})
    emit(pid=os.getpid(), phases=out, matmul_ms=ms)


def open_context_now():
    """A context through the CUDA driver API, at once (no PyTorch import
    first: that takes seconds): the primary context, which PyTorch then
    uses. The wall-clock time it was open."""
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    for rc, what in ((cuda.cuInit(0), "cuInit"), (cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet"),
                     (cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")):
        if rc != 0:
            raise SystemExit(f"{what}: CUDA error {rc}")
    return time.time()


def worker(argv, stub):
    """The processes the steps run under wattprof (`--worker MODE ...`)."""
    mode = argv[0]
    me = [sys.executable, os.path.abspath(__file__)] + (["--stub", "-"] if stub else [])

    def children(*args_of):
        # Started in order: on the stub, `child/N` is the N-th by pid.
        kids = [subprocess.Popen(me + ["--worker"] + [str(x) for x in a], stdout=subprocess.PIPE, text=True)
                for a in args_of]
        for k in kids:
            print(k.communicate()[0].strip(), flush=True)

    if mode == "turns":
        # Two children take turns: A busy 200 ms, B 100 ms, of every 300.
        seconds, t0 = float(argv[1]), time.monotonic() + 1.5
        children(("turn", seconds, t0, "0.0", "0.2"), ("turn", seconds, t0, "0.2", "0.3"))
    elif mode == "turn":
        seconds, t0, a, b = (float(x) for x in argv[1:5])
        busy = 0.0
        if stub:
            ctx = None
        else:
            torch, dev = torch_device()
            x = torch.randn(2048, 2048, device=dev)
            ctx = (torch, x)
        while time.monotonic() < t0:
            time.sleep(0.01)
        end = t0 + seconds
        while True:
            now = time.monotonic()
            if now >= end:
                break
            phase = (now - t0) % 0.3
            if a <= phase < b:
                slot_end = min(now + (b - phase), end)
                s = time.monotonic()
                if ctx is None:
                    time.sleep(max(0.0, slot_end - s))
                else:
                    torch, x = ctx
                    while time.monotonic() < slot_end:
                        x = (x @ x).tanh_()
                        torch.cuda.synchronize()
                busy += time.monotonic() - s
            else:
                wait = (a - phase) % 0.3
                time.sleep(min(wait, max(0.0, end - now)))
        emit(pid=os.getpid(), busy_s=busy)
    elif mode == "hold":
        # Wait, then hold a context and do nothing.
        delay, seconds = float(argv[1]), float(argv[2])
        time.sleep(delay)
        if not stub:
            torch, dev = torch_device()
            keep = torch.zeros(1, device=dev)  # noqa: F841 (the context)
        time.sleep(seconds)
        emit(pid=os.getpid(), held_s=seconds)
    elif mode == "busy":
        delay, seconds = float(argv[1]), float(argv[2])
        time.sleep(delay)
        busy = gpu_work(seconds, stub)
        emit(pid=os.getpid(), busy_s=busy)
    elif mode == "beside":
        # A holder and, `after` s later, a busy process: both children,
        # both ending together.
        delay, seconds, after = float(argv[1]), float(argv[2]), float(argv[3])
        children(("hold", delay, seconds), ("busy", delay + after, seconds - after))
    elif mode == "job":
        # A fixed amount of work: the overhead step's job.
        n = int(argv[1])
        if stub:
            x = 0
            for i in range(n * 20000):
                x += i * i
        else:
            torch, dev = torch_device()
            a = torch.randn(2048, 2048, device=dev)
            torch.cuda.synchronize()
            t = time.monotonic()
            for _ in range(n):
                a = (a @ a).tanh_()
            torch.cuda.synchronize()
            emit(compute_s=time.monotonic() - t)
    elif mode == "train":
        train(int(argv[1]), stub)
    elif mode == "slice":
        # A and B from `prep` s on (time for PyTorch and the contexts).
        ta, tb, tt, prep = (float(x) for x in argv[1:5])
        t0 = time.monotonic() + prep
        emit(t0_unix=unix_of(t0))
        children(("slice-one", "A", t0, ta, tb, tt), ("slice-one", "B", t0, ta, tb, tt))
    elif mode == "slice-one":
        slice_one(argv[1], *(float(x) for x in argv[2:6]), stub)
    elif mode == "duty":
        duty_phases(float(argv[1]), float(argv[2]), stub)
    elif mode == "ctx1s":
        # A context at once, then ~`seconds` of full load.
        seconds = float(argv[1])
        ctx_unix = time.time() if stub else open_context_now()
        busy = gpu_work(seconds, stub)
        emit(pid=os.getpid(), ctx_unix=ctx_unix, busy_s=busy)
    elif mode == "physics":
        # From t0, P s each: nothing; a holder alone; busy + the holder;
        # busy alone.
        t0, p = argv[1], argv[2]
        children(("phys-hold", t0, p), ("phys-busy", t0, p))
    elif mode == "phys-hold":
        t0, p = float(argv[1]), float(argv[2])
        if not stub:
            import torch  # noqa: F401,PLC0415 (imported, no context yet)
        sleep_until(t0 + p)
        if not stub:
            torch, dev = torch_device()
            keep = torch.zeros(1, device=dev)  # noqa: F841 (the context)
        # On the stub the scenario's windows say when it holds: it stays,
        # so `child/2` stays the busy one.
        sleep_until(t0 + (4 if stub else 3) * p)
        emit(pid=os.getpid(), role="holder")
    elif mode == "phys-busy":
        t0, p = float(argv[1]), float(argv[2])
        if not stub:
            import torch  # noqa: F401,PLC0415
        sleep_until(t0 + 2 * p)
        gpu_work(t0 + 4 * p - time.monotonic(), stub)
        emit(pid=os.getpid(), role="busy")
    elif mode == "short":
        # A job that ends mid-interval (`mid` s after the start), a 0.3 s
        # burst at `at` s, and the parent for `total` s.
        mid, at, burst, total = (float(x) for x in argv[1:5])
        t0 = time.monotonic()
        children(("mid", t0, mid), ("burst", t0, at, burst))
        sleep_until(t0 + total)
    elif mode == "mid":
        t0, end = float(argv[1]), float(argv[2])
        gpu_work(t0 + end - time.monotonic(), stub)
        emit(pid=os.getpid(), role="mid", exit_unix=time.time())
    elif mode == "burst":
        t0, at, secs = (float(x) for x in argv[1:4])
        if not stub:
            import torch  # noqa: F401,PLC0415 (imported before: the context lives ~the burst only)
        sleep_until(t0 + at)
        gpu_work(secs, stub)
        emit(pid=os.getpid(), role="burst")
    else:
        raise SystemExit(f"unknown worker {mode}")


class SampleWatch:
    """Every per-process sample NVML gives, asked every 50 ms from 2 s
    before the newest seen, repeats left out: (pid, timestamp µs, SM,
    first seen µs)."""

    def __init__(self, nvml):
        self.nvml, self.raw, self.done = nvml, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        seen, newest = set(), 0
        while not self.done.wait(0.05):
            rc, s = self.nvml.samples(max(0, newest - 2_000_000))
            now = time.time() * 1e6
            for x in s:
                key = (x.pid, x.timeStamp, x.smUtil)
                if x.pid and x.smUtil <= 100 and x.timeStamp <= now + 1e6 and key not in seen:
                    seen.add(key)
                    self.raw.append((x.pid, x.timeStamp, x.smUtil, now))
                    newest = max(newest, x.timeStamp)

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.raw


class PowerWatch:
    """NVML's power reading every 100 ms: (monotonic s, W)."""

    def __init__(self, nvml):
        self.nvml, self.raw, self.done = nvml, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.wait(0.1):
            try:
                self.raw.append((time.monotonic(), self.nvml.power_w()))
            except RuntimeError:
                pass

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.raw


class Cut(Exception):
    """The budget's deadline came during a step."""


# ------------------------------------------------------- recording reads ---

def gpu_domain(rec):
    """The whole recording's GPU 0 domain (`energy.domains[]`)."""
    return next((d for d in rec["energy"]["domains"] if d["domain"] == "gpu" and d.get("package") in (0, None)),
                None)


def above_idle(rec):
    """GPU energy above idle: measured - idle (J)."""
    d = gpu_domain(rec)
    return d["measured_j"] - d["idle_j"] if d else float("nan")


def tree_gpu_j(rec):
    return rec["energy"]["groups"]["tree"].get("gpu_j", 0.0)


def conservation_off(rec):
    """The worst |attributed + idle + unattributed - measured| (J) of the
    GPU domain, over the recording and each interval."""
    rows = [d for d in rec["energy"]["domains"] if d["domain"] == "gpu"]
    rows += [d for i in rec.get("intervals", []) for d in i.get("domains", []) if d["domain"] == "gpu"]
    if not rows:
        return float("inf")
    return max(abs(d["attributed_j"] + d["idle_j"] + d["unattributed_j"] - d["measured_j"]) for d in rows)


def interval_span(rec, iv):
    """An interval's (start, end), wall-clock s."""
    end = (rec["start_unix_ns"] + iv["t_ns"]) / 1e9
    return end - iv["duration_ns"] / 1e9, end


def dynamic_split(rec, pids, held_w, within=None):
    """Each process's dynamic GPU energy over the intervals inside
    `within` (wall-clock from, to): its GPU J less its part of the held
    power (held W x the interval / the holders NVML listed, as wattprof
    shares it), where it was listed. Held power is shared equally, so a
    whole-J split would lean to 1:1 whatever the work. (dynamic J by
    pid, whole J by pid, intervals used.)"""
    dyn, whole, used = dict.fromkeys(pids, 0.0), dict.fromkeys(pids, 0.0), 0
    for iv in rec.get("intervals", []):
        a, b = interval_span(rec, iv)
        if within and not (a >= within[0] - 0.01 and b <= within[1] + 0.01):
            continue
        g = (iv.get("gpus") or [None])[0]
        if not g:
            continue
        used += 1
        holders = [p["pid"] for p in g.get("processes") or []]
        w = g.get("held_w", held_w) or 0.0
        rows = {r["pid"]: r for r in iv.get("processes") or []}
        for pid in pids:
            j = rows[pid].get("gpu_j", 0.0) if pid in rows else 0.0
            whole[pid] += j
            dyn[pid] += j - (w * iv["duration_ns"] / 1e9 / len(holders) if pid in holders else 0.0)
    return dyn, whole, used


# ---------------------------------------------------------------- check ---

class Check:
    def __init__(self, args):
        self.args = args
        self.stub = args.stub is not None
        self.out = args.out
        self.results, self.steps, self.raw, self.live = [], [], {}, set()
        self.t_start = time.monotonic()
        self.deadline = self.t_start + args.budget_s
        self.host, self.state0, self.uuid = {}, None, None
        # The calibrated host model (`calibrate`), once written: its path
        # and this GPU's idle and held W.
        self.hm, self.cal = None, {}
        os.makedirs(self.out, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="wattprof-gpu-check-")
        self.lib = None if not self.stub else os.path.join(self.tmp, "libnvidia-ml.so.1")
        if self.stub:
            shutil.copy(args.stub, self.lib)
            self.scenario(f"{STUB_GPU} {STUB_LOAD}\n")

    def scenario(self, text):
        with open(os.path.join(self.tmp, "scenario.txt"), "w") as f:
            f.write(text)

    def quick(self, real, quick):
        return quick if self.args.quick else real

    def me(self):
        return [sys.executable, os.path.abspath(__file__)] + (["--stub", "-"] if self.stub else [])

    def left(self):
        return self.deadline - time.monotonic()

    def settle(self):
        """After a load, the GPU's power takes up to a second to fall back
        (an H200's did): 2 s before a step that measures above idle."""
        if not self.stub:
            time.sleep(2.0)

    # ------------------------------------------------------- recording ---

    def record(self, step, figure, value, bound, ok, unit="", note=""):
        """`ok` None: a figure recorded with no bound (not a pass)."""
        self.results.append({"step": step, "figure": figure, "value": value, "unit": unit,
                             "bound": bound, "pass": None if ok is None else bool(ok), "note": note})
        mark = "info" if ok is None else "pass" if ok else "FAIL"
        v = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"[{mark}] {step}: {figure} = {v} {unit} (bound: {bound}) {note}".rstrip(), flush=True)
        self.write(False)

    def skip(self, step, why):
        """A step (or part) not run: said, neither a pass nor a failure."""
        self.results.append({"step": step, "figure": "skipped", "value": None, "unit": "", "bound": "-",
                             "pass": None, "skipped": True, "note": why})
        print(f"[skip] {step}: {why}", flush=True)
        self.write(False)

    def summary(self, complete):
        done = [r for r in self.results if not r.get("skipped")]
        return {"complete": complete, "host": self.host, "gpu_state": self.state0, "calibrated": self.cal,
                "stub": self.stub, "quick": self.args.quick, "budget_s": self.args.budget_s,
                "elapsed_s": round(time.monotonic() - self.t_start, 1), "steps": self.steps,
                "results": self.results,
                "passed": sum(r["pass"] is True for r in done),
                "failed": sum(r["pass"] is False for r in done),
                "recorded": sum(r["pass"] is None for r in done),
                "skipped": sum(1 for r in self.results if r.get("skipped")),
                "raw": self.raw}

    def write(self, complete):
        """DIR/gpu-check.json and .txt, whole, each time (a run cut short
        keeps what it measured; `complete` says whether it was)."""
        s = self.summary(complete)
        path = os.path.join(self.out, "gpu-check.json")
        with open(path + ".new", "w") as f:
            json.dump(s, f, indent=1)
        os.replace(path + ".new", path)
        with open(os.path.join(self.out, "gpu-check.txt"), "w") as f:
            f.write(f"{self.host}\ncomplete: {complete}, {s['elapsed_s']} s of {self.args.budget_s}\n")
            for r in self.results:
                mark = ("skip" if r.get("skipped") else "info" if r["pass"] is None
                        else "pass" if r["pass"] else "FAIL")
                f.write(f"{mark}  {r['step']}: {r['figure']} = {r['value']} {r['unit']}"
                        f" (bound: {r['bound']}) {r['note']}\n")

    # ------------------------------------------------------- processes ---

    def spawn(self, cmd, env=None):
        """A process of the check's, in its own session (so the deadline
        can stop it and everything it started)."""
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE,
                             text=True, env=env, start_new_session=True)
        self.live.add(p)
        return p

    def finish(self, p, input_text=None):
        """(exit status, stdout, stderr) of `p`, stopped at the deadline."""
        try:
            out, err = p.communicate(input_text, timeout=max(1.0, self.left()))
        except subprocess.TimeoutExpired:
            self.stop(p)
            raise Cut(f"stopped at the deadline ({self.args.budget_s:.0f} s)") from None
        finally:
            if p.poll() is not None:
                self.live.discard(p)
        return p.returncode, out, err

    def call(self, cmd, env=None, input_text=None):
        return self.finish(self.spawn(cmd, env), input_text)

    def stop(self, p):
        """Ctrl-C to its process group (wattprof then writes what it has),
        then SIGKILL."""
        for sig in (signal.SIGINT, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                p.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        self.live.discard(p)

    @staticmethod
    def lines(stdout):
        return [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]

    def wattprof(self, args, cmd, name, host_model=False, env=None):
        """`wattprof SUBCOMMAND ...` (the stub's NVML where there is one),
        with the calibrated host model (`host_model`) or none: the steps
        that measure what wattprof learns must not read a model some
        earlier run left at the default place. (recording, the JSON lines
        of the command's output.)"""
        out = os.path.join(self.tmp, f"{name}.json")
        lib = ["--nvml-lib", self.lib] if self.lib else []
        hm = ["--host-model", self.hm if host_model and self.hm else "none"]
        full = [self.args.wattprof] + args[:1] + lib + hm + args[1:] + ["--output", out]
        if cmd:
            full += ["--"] + cmd
        rc, stdout, stderr = self.call(full, env=env)
        if rc != 0:
            raise RuntimeError(f"{' '.join(full)}: exit {rc}: {stderr.strip()[-400:]}")
        with open(out) as f:
            rec = json.load(f)
        shutil.copy(out, os.path.join(self.out, f"{name}.json"))
        return rec, self.lines(stdout)

    def nvml(self):
        return Nvml(self.lib or "libnvidia-ml.so.1")

    def background_load(self, seconds):
        return self.spawn(self.me() + ["--worker", "busy", "0", str(seconds)])

    # --------------------------------------------------------- steps ---

    def gpu_state(self):
        step = "gpu state"
        with self.nvml() as n:
            self.host = {"gpu": n.name(), "uuid": n.uuid(), "driver": n.driver(), "kernel": os.uname().release}
            self.uuid = self.host["uuid"]
            self.state0 = n.state()
        for k, v in self.state0.items():
            self.record(step, f"at the start: {k}", v, "recorded (no bound)", None)

    def settings_unchanged(self):
        """The end of `gpu state`: the settings as they were (the check
        never changes one; MPS's start must not have either)."""
        step = "gpu state"
        if self.state0 is None:
            return
        try:
            with self.nvml() as n:
                now = n.state()
        except RuntimeError as e:
            self.record(step, "settings at the end", 0.0, "read", False, note=str(e))
            return
        changed = {k: [self.state0.get(k), now.get(k)] for k in SETTINGS if self.state0.get(k) != now.get(k)}
        self.record(step, "settings changed by the end (power limit, persistence, compute, MIG mode)",
                    len(changed), "none", not changed, note=json.dumps(changed) if changed else "as at the start")
        self.record(step, "at the end: clocks, temperature, throttle reasons", now.get("temperature_c"),
                    "recorded (no bound)", None, note=json.dumps({k: now[k] for k in now if k not in SETTINGS}))

    def calibrate(self):
        step = "calibrate"
        if self.stub:
            # 2 s steps, so a counter stepping every 20 ms (a 100 ms step
            # would be 6% of the held figure over 2 s).
            self.scenario(f"{STUB_GPU} energy_step_ms=20 settle_ms=1000 {STUB_LOAD}\n")
        path = os.path.join(self.out, "host-model.json")
        # --gpu-only keeps the CPU fits of a model already there: never an
        # earlier check's (another machine's is refused).
        if os.path.exists(path):
            os.remove(path)
        cmd = [self.args.wattprof, "calibrate", "--gpu-only", "--step", "2s" if self.stub else "5s", "-o", path]
        if self.lib:
            cmd += ["--nvml-lib", self.lib, "--cuda-lib", self.lib]
        t = time.monotonic()
        rc, _, err = self.call(cmd)
        took = time.monotonic() - t
        if rc != 0:
            self.record(step, "calibrate --gpu-only", rc, "exit 0", False, note=err.strip()[-300:])
            return
        with open(path) as f:
            model = json.load(f)
        gpus = model.get("gpus") or []
        mine = next((g for g in gpus if g.get("uuid") == self.uuid), {})
        idle_w, held_w = mine.get("idle_w"), mine.get("held_w")
        ok = isinstance(idle_w, (int, float)) and idle_w > 0 and isinstance(held_w, (int, float)) and held_w >= 0
        self.record(step, "calibrated idle power (no context)", idle_w if ok else 0.0,
                    f"written for {self.uuid}, > 0, with a held figure", ok, "W",
                    note=f"{len(gpus)} GPU(s) in the model; {took:.1f} s" + ("" if ok else f"; {err.strip()[-300:]}"))
        if ok:
            self.hm, self.cal = path, {"idle_w": idle_w, "held_w": held_w}
            self.record(step, "calibrated held power (a context, no work)", held_w,
                        "recorded; against the steady power under holder physics", None, "W")

    def needs_model(self, step):
        """The steps whose bound is in the calibrated figures: skipped
        without them (calibrate's failure is counted once, there)."""
        if not self.hm:
            self.skip(step, "no calibrated host model (see calibrate)")
        return bool(self.hm)

    def training(self):
        step = "training job"
        rounds = self.quick(2, 1)
        n = 150 if self.stub else self.quick(1000, 300)
        if self.stub:
            # The job holds its context from 0.3 s and works from 0.8 s.
            self.scenario(f"{STUB_GPU} energy_step_ms=100 sample_ms=200 settle_ms=1000 {STUB_LOAD} "
                          "procs=child:0:2048@300-800,child:85:2048@800-600000\n")
        job = self.me() + ["--worker", "train", str(n)]
        alone, under, recs = [], [], []
        for r in range(rounds):
            # In turns, the order swapped each round: a GPU warming up
            # slows whichever comes later.
            for kind in ("alone", "under") if r % 2 == 0 else ("under", "alone"):
                self.settle()
                if kind == "alone":
                    rc, out, err = self.call(job)
                    if rc != 0:
                        raise RuntimeError(f"the training job alone: exit {rc}: {err.strip()[-300:]}")
                    alone.append(self.lines(out)[-1]["steps_per_s"])
                else:
                    rec, lines = self.wattprof(["run"], job, f"training-{r}", host_model=True)
                    under.append(next(x["steps_per_s"] for x in lines if "steps_per_s" in x))
                    recs.append(rec)
        ratio = statistics.median(u / a for a, u in zip(alone, under))
        note = (f"alone {statistics.median(alone):.1f} steps/s, under {statistics.median(under):.1f}; "
                f"per round {[round(u / a, 4) for a, u in zip(alone, under)]}")
        if self.stub:
            self.record(step, f"steps/s under wattprof run / alone, median of {rounds}", ratio,
                        "recorded (stub: a CPU stand-in)", None, note=note)
        else:
            self.record(step, f"steps/s under wattprof run / alone, median of {rounds}", ratio, ">= 0.97",
                        ratio >= 0.97, note=note)
        off = max(conservation_off(r) for r in recs)
        self.record(step, "GPU domain: |attributed + idle + unattributed - measured|, worst", off, "<= 1e-6 J",
                    off <= 1e-6, "J", note=f"the recording and each interval, {len(recs)} run(s)")
        shares = [tree_gpu_j(r) / above_idle(r) if above_idle(r) > 0 else 0.0 for r in recs]
        d = gpu_domain(recs[-1]) or {}
        self.record(step, "the tree's GPU J / (measured - idle), lowest", min(shares), ">= 0.99",
                    min(shares) >= 0.99,
                    note=f"per run {[round(s, 4) for s in shares]}; last: measured {d.get('measured_j', 0):.1f} J, "
                         f"idle {d.get('idle_j', 0):.1f}, unattributed {d.get('unattributed_j', 0):.1f}")
        srcs = [(gpu_domain(r) or {}).get("static_source") for r in recs]
        self.record(step, "where the GPU's idle power came from", srcs[-1] or "absent",
                    "recorded: host_model with the calibrated model", None,
                    note=f"per run {srcs}; host model {'given' if self.hm else 'none (calibrate failed)'}")

    def time_slicing(self):
        step = "time-slicing"
        if self.stub:
            # A works throughout, B half of each second (on the stub's
            # clock, so on the driver's 250 ms periods), both from 1 s; a
            # sample reads 92% for any period with a kernel, as on the H200.
            ta, tb, tt, prep = 0.0, 0.0, 7.0, 0.0
            self.scenario(f"{STUB_GPU} energy_step_ms=100 sample_ms=250 timeslice=1 {STUB_LOAD} "
                          f"procs=child/1:100:1024@1000-600000,"
                          f"child/2:100:1024~0-{SLICE_ON_S * 1e3:.0f}/{SLICE_CYCLE_S * 1e3:.0f}@1000-600000\n")
        else:
            # Alone a whole number of B's cycles each, then together; 6 s
            # for PyTorch and both contexts first.
            ta, tb, tt, prep = self.quick(3.0, 2.0), self.quick(3.0, 2.0), self.quick(12.0, 7.0), 6.0
        self.settle()
        rec, lines = self.wattprof(["run", "--interval", "1s"],
                                   self.me() + ["--worker", "slice"] + [str(x) for x in (ta, tb, tt, prep)],
                                   "time-slicing", host_model=True)
        t0 = next(x["t0_unix"] for x in lines if "t0_unix" in x)
        kids = {x["role"]: x for x in lines if "role" in x}
        a, b = kids["A"], kids["B"]
        if self.stub:
            # Both at work a second before the profile's second second
            # (the stub's clock starts before it), and the exit left out.
            start = rec["start_unix_ns"] / 1e9
            within = (start + 2.0, start + rec["wall_ns"] / 1e9 - 1.0)
        else:
            # Half a second after both start working together.
            within = (t0 + ta + tb + 0.5, t0 + ta + tb + tt)
        used = [iv for iv in rec.get("intervals", [])
                if within[0] - 0.01 <= interval_span(rec, iv)[0] and interval_span(rec, iv)[1] <= within[1] + 0.01]
        held = self.cal.get("held_w", 0.0)
        dyn, whole, n = dynamic_split(rec, [a["pid"], b["pid"]], held, within)
        if n < 3 or min(dyn.values()) <= 0:
            self.record(step, "1s: both processes' dynamic GPU J", 0.0, "both > 0 over 3+ intervals", False,
                        note=f"{n} intervals, dynamic {dyn}")
            return
        span = (interval_span(rec, used[0])[0], interval_span(rec, used[-1])[1])
        if self.stub:
            # The scenario's: A alone half the time; when both work, each
            # has half of it.
            truth = 1 - 0.5 * SLICE_ON_S / SLICE_CYCLE_S
            how = "the scenario's (A: all of B's off time, half of its on time)"
        else:
            def steps_in(k):
                return sum(c for i, c in enumerate(k["bins"]) if span[0] <= t0 + (i + 0.5) * k["bin_s"] < span[1])

            # Each one's GPU time: its steps together at its own rate
            # alone (A's over its alone phase, B's over its time working).
            ga = steps_in(a) / (a["alone_steps"] / a["alone_s"])
            gb = steps_in(b) / (b["alone_steps"] / b["alone_s"])
            truth = ga / (ga + gb)
            how = (f"rates alone A {a['alone_steps'] / a['alone_s']:.1f}, B {b['alone_steps'] / b['alone_s']:.1f} "
                   f"steps/s; together {ga:.2f} + {gb:.2f} GPU s of {span[1] - span[0]:.2f} s "
                   f"(late {a['late_s']}, {b['late_s']} s)")
        share = dyn[a["pid"]] / (dyn[a["pid"]] + dyn[b["pid"]])
        off = abs(share - truth)
        self.record(step, f"1s: A's share of the dynamic GPU J {share:.3f} vs its share of the GPU time {truth:.3f}",
                    off, "within 0.02", off <= 0.02, note=f"{n} intervals; {how}")
        if not self.stub:
            # The same once the samples' window (about 2 s on an H200) is
            # wholly within the time both work: what lag leaves out.
            later = (within[0] + 2.0, within[1])
            d2, _, n2 = dynamic_split(rec, [a["pid"], b["pid"]], held, later)
            used2 = [iv for iv in rec.get("intervals", [])
                     if later[0] - 0.01 <= interval_span(rec, iv)[0] and interval_span(rec, iv)[1] <= later[1] + 0.01]
            if n2 >= 2 and min(d2.values()) > 0 and used2:
                span = (interval_span(rec, used2[0])[0], interval_span(rec, used2[-1])[1])
                g2a = steps_in(a) / (a["alone_steps"] / a["alone_s"])
                g2b = steps_in(b) / (b["alone_steps"] / b["alone_s"])
                s2 = d2[a["pid"]] / (d2[a["pid"]] + d2[b["pid"]])
                self.record(step, f"1s, from 2 s after both start: A's share {s2:.3f} vs its GPU time share "
                                  f"{g2a / (g2a + g2b):.3f}", abs(s2 - g2a / (g2a + g2b)), "recorded (no bound)",
                            None, note=f"{n2} intervals")
        wa, wb = whole[a["pid"]], whole[b["pid"]]
        self.record(step, "1s: A's share of the whole GPU J (held power shared equally)", wa / (wa + wb),
                    "recorded (no bound)", None,
                    note=f"{wa:.1f} : {wb:.1f} J; held {held:.2f} W from the {'interval rows or ' if held else ''}"
                         "calibrated model")

    def context_at_1s(self):
        step = "context at 1 s"
        if not self.needs_model(step):
            return
        work = self.quick(8.0, 4.0)
        if self.stub:
            self.scenario(f"{STUB_GPU} energy_step_ms=100 sample_ms=200 settle_ms=1000 {STUB_LOAD} "
                          "procs=child:0:1024@300-1000,child:90:1024@1000-600000\n")
        self.settle()
        rec, lines = self.wattprof(["run", "--interval", "1s"], self.me() + ["--worker", "ctx1s", str(work)],
                                   "context-at-1s", host_model=True)
        job = next(x for x in lines if "ctx_unix" in x)
        after = job["ctx_unix"] - rec["start_unix_ns"] / 1e9
        wall = rec["wall_ns"] / 1e9
        d = gpu_domain(rec)
        expect = d["measured_j"] - self.cal["idle_w"] * wall
        got = tree_gpu_j(rec)
        off = abs(got / expect - 1) if expect > 0 else float("inf")
        # The draw above idle after the last read that listed a context
        # (the job's last moments and the GPU settling after its exit): the
        # ended job's, or lost to idle if wattprof drops it.
        ivs = rec.get("intervals", [])
        last = max((k for k, iv in enumerate(ivs) if iv.get("gpus") and iv["gpus"][0].get("processes")), default=-1)
        tail = sum(g["measured_j"] - self.cal["idle_w"] * iv["duration_ns"] / 1e9 for iv in ivs[last + 1:]
                   for g in iv.get("domains", []) if g["domain"] == "gpu")
        self.record(step, f"the job's GPU J {got:.1f} vs measured - idle W x wall {expect:.1f}", off, "within 2%",
                    off <= 0.02, note=f"context {after:.2f} s after the profile's start; wall {wall:.1f} s; "
                                      f"idle {d['idle_j']:.1f} J (calibrated {self.cal['idle_w'] * wall:.1f}), "
                                      f"unattributed {d['unattributed_j']:.1f} J; after the last read listing it "
                                      f"{tail:.1f} J above idle; source {d.get('static_source')}")

    def sample_meaning(self):
        step = "what a sample means"
        # The stub's phases 2.4 s: a whole number of every period, and
        # twice its samples' window (1.2 s, a whole number of them too).
        length = 2.4 if self.stub else self.quick(3.6, 2.4)
        lead = 1.2 if self.stub else 6.0
        if self.stub:
            parts = []
            for i, (_, duty, period) in enumerate(DUTY_PHASES):
                w = f"@{(lead + i * length) * 1e3:.0f}-{(lead + (i + 1) * length) * 1e3:.0f}"
                parts.append(f"child:100:1024{w}" if period == 0 else
                             f"child:100:1024~0-{duty * period * 1e3:.0f}/{period * 1e3:.0f}{w}")
            # A shorter window than the H200's 2 s, for shorter phases; the
            # analysis learns the window from the ramp.
            self.scenario(f"{STUB_GPU} sample_ms=200 sm_window_ms=1200 {STUB_LOAD} procs={','.join(parts)}\n")
        self.settle()
        with self.nvml() as n:
            # The stub's clock starts at this init: the phases from `lead`.
            t0 = time.monotonic() + lead
            watch = SampleWatch(n)
            try:
                rc, out, err = self.call(self.me() + ["--worker", "duty", str(t0), str(length)])
            finally:
                raw = watch.stop()
        if rc != 0:
            raise RuntimeError(f"the duty worker: exit {rc}: {err.strip()[-300:]}")
        job = self.lines(out)[-1]
        pid, phases = job["pid"], job["phases"]
        # The driver revises its newest sample (an H200 returned one
        # timestamp with up to four values): the last value returned stands.
        last = {}
        for p, ts, sm, _ in raw:
            if p == pid:
                last[ts] = sm
        mine = sorted((ts / 1e6, sm) for ts, sm in last.items())
        revised = sum(1 for p, _, _, _ in raw if p == pid) - len(mine)
        self.raw[step] = {"pid": pid, "phases": phases, "matmul_ms": job.get("matmul_ms"),
                          "samples": [{"pid": p, "ts_us": ts, "sm": sm, "seen_us": seen} for p, ts, sm, seen in raw]}
        # The driver's period: the spacing of the 100% phase's samples.
        ph0 = phases[0]
        full = [(ts, sm) for ts, sm in mine if ph0["start_unix"] <= ts <= ph0["end_unix"] + 0.02]
        gaps = [q[0] - p[0] for p, q in zip(full, full[1:])]
        period = statistics.median(gaps) if gaps else 0.2
        # What a sample looks back over: how long after the load began it
        # took to reach 95% of the phase's last value (an H200's rose
        # from 0 to 100 over about 2 s: a moving average).
        top = full[-1][1] if full else 0
        reach = next((ts - ph0["start_unix"] for ts, sm in full if top and sm >= 0.95 * top), None)
        window = reach if reach is not None else period
        self.record(step, "a sample's window: from a load's start to 95% of its value", window, "recorded (no bound)",
                    None, "s", note=f"driver period {period * 1e3:.0f} ms; {revised} revisions of a sample "
                                     f"(the same timestamp again with another value) of {len(mine)} samples")

        def mean_sm(ph):
            # The samples whose window lies within the phase: their mean.
            lo, hi = ph["start_unix"] + window + 0.05, ph["end_unix"] + 0.02
            sm = [s for ts, s in mine if lo <= ts <= hi]
            return (statistics.mean(sm) if sm else 0.0), len(sm)

        base, nb = mean_sm(ph0)
        length = ph0["end_unix"] - ph0["start_unix"]
        base_duty = ph0["busy_s"] / length
        self.record(step, "100%: NVML's mean SM once its window is within the phase", base, "recorded (no bound)",
                    None, "%", note=f"true duty {base_duty:.3f} (CUDA events); {nb} samples")
        if base <= 0:
            self.record(step, "samples of the working process", 0.0, "some", False, note=f"pid {pid}")
            return
        for ph in phases[1:]:
            m, ns = mean_sm(ph)
            duty = ph["busy_s"] / (ph["end_unix"] - ph["start_unix"])
            rn, rt = m / base, duty / base_duty
            off = abs(rn - rt)
            self.record(step, f"{ph['name']}: NVML {rn:.3f} of the 100% phase's, true duty {rt:.3f} of it",
                        off, "within 0.10", off <= 0.10 and ns > 0,
                        note=f"mean SM {m:.1f}% ({ns} samples), duty {duty:.3f}, "
                             f"values {sorted({s for ts, s in mine if ph['start_unix'] <= ts <= ph['end_unix']})[:8]}")

    def holder_physics(self):
        step = "holder physics"
        p = 3.0 if self.stub else self.quick(7.0, 4.0)
        if self.stub:
            self.scenario(f"{STUB_GPU} energy_step_ms=100 settle_ms=1000 {STUB_LOAD} "
                          f"procs=child/1:0:1024@{p * 1e3:.0f}-{3 * p * 1e3:.0f},"
                          f"child/2:80:1024@{2 * p * 1e3:.0f}-{4 * p * 1e3:.0f}\n")
        self.settle()
        with self.nvml() as n:
            t0 = time.monotonic()
            watch = PowerWatch(n)
            try:
                rc, _, err = self.call(self.me() + ["--worker", "physics", str(t0), str(p)])
            finally:
                raw = watch.stop()
        if rc != 0:
            raise RuntimeError(f"the physics worker: exit {rc}: {err.strip()[-300:]}")

        def steady(k):
            # NVML's readings (each a mean over the last second) over the
            # phase's later half: the draw settled, the second behind it in.
            w = [x for t, x in raw if t0 + (k + 0.5) * p <= t <= t0 + (k + 1) * p]
            return statistics.mean(w) if w else float("nan")

        nothing, holder, both, busy = (steady(k) for k in range(4))
        held = holder - nothing
        extra = both - busy
        self.raw[step] = {"phase_s": p, "steady_w": {"nothing": nothing, "holder": holder,
                                                     "busy_and_holder": both, "busy": busy}}
        limit = (self.state0 or {}).get("power_limit_w")
        capped = isinstance(limit, float) and busy >= 0.95 * limit
        # wattprof's model: held power is the GPU awake, paid once however
        # many contexts are open; a holder beside busy work adds little, and
        # is charged its half of the held power as rent. Were each context
        # to add the whole held power, that half would be too little.
        off = abs(extra) / held if held > 0 else float("inf")
        self.record(step, f"a holder beside busy work adds {extra:.2f} W (alone it adds {held:.2f} W)", off,
                    "under 20% of the held power", off < 0.20,
                    note=f"steady: nothing {nothing:.2f} W, holder {holder:.2f}, busy + holder {both:.2f}, "
                         f"busy {busy:.2f}" + (f"; at the {limit:.0f} W power limit" if capped else ""))
        if not self.cal:
            self.skip(step, "calibrated figures: no host model (see calibrate)")
            return
        for name, cal, ref in (("idle", self.cal["idle_w"], nothing), ("held", self.cal["held_w"], held)):
            off = abs(cal / ref - 1) if ref > 0 else float("inf")
            self.record(step, f"calibrated {name} power vs the steady {ref:.2f} W", cal, "within 5%", off <= 0.05, "W",
                        note=f"{off:.1%} off")

    def short_jobs(self):
        step = "short jobs"
        # A job ending 3.5-4 s in, a 0.3 s burst 2.5 s in, the run 5-6 s.
        # On a GPU the burst's context lives its CUDA start too (0.3-0.5 s):
        # whether a 1 s read falls in its life is chance. On the stub it
        # holds 300 ms of the stub's clock, whose offset from the reads is
        # wattprof's start: also chance. Either way it must get some.
        mid, at, total = (3.5, 2.5, 5.0) if self.stub else (4.0, 2.5, 6.0)
        if self.stub:
            self.scenario(f"{STUB_GPU} energy_step_ms=100 sample_ms=200 settle_ms=1000 {STUB_LOAD} "
                          "procs=child/1:60:1024@300-600000,child/2:100:1024@2200-2500\n")
        self.settle()
        rec, lines = self.wattprof(["run", "--interval", "1s"],
                                   self.me() + ["--worker", "short", str(mid), str(at), "0.3", str(total)],
                                   "short-jobs", host_model=True)
        roles = {x["role"]: x for x in lines if "role" in x}
        procs = {q["pid"]: q for q in rec["processes"]}
        s = procs.get(roles["burst"]["pid"])
        sj = s["energy"].get("gpu_j", 0.0) if s else 0.0
        self.record(step, "a 0.3 s burst between two reads: its GPU J", sj, "> 0", sj > 0, "J",
                    note="" if s else "not among the recording's processes")
        m = procs.get(roles["mid"]["pid"])
        exit_ns = (m or {}).get("exit_ns")
        if exit_ns is None:
            exit_ns = roles["mid"]["exit_unix"] * 1e9 - rec["start_unix_ns"]
        iv = next((i for i in rec.get("intervals", []) if i["t_ns"] - i["duration_ns"] < exit_ns <= i["t_ns"]), None)
        if iv is None:
            self.record(step, "a job ending mid-interval: the interval it ended in", 0.0, "found", False,
                        note=f"exit at {exit_ns / 1e9:.2f} s")
            return
        row = next((r for r in iv.get("processes") or [] if r["pid"] == roles["mid"]["pid"]), None)
        mj = row.get("gpu_j", 0.0) if row else 0.0
        into = 1 - (iv["t_ns"] - exit_ns) / iv["duration_ns"]
        self.record(step, f"a job ending mid-interval ({into:.0%} into it): its GPU J in that interval", mj, "> 0",
                    mj > 0, "J", note=f"of {iv['gpus'][0]['energy_j'] if iv.get('gpus') else 0:.1f} J measured")

    def pid_namespace(self):
        step = "pid namespace"
        unshare = shutil.which("unshare")
        ns = [unshare, "--pid", "--fork", "--mount-proc"] if unshare else None
        if ns:
            probe = subprocess.run(ns + ["true"], capture_output=True, text=True, timeout=30)
        if not ns or probe.returncode != 0:
            self.skip(step, "unshare --pid --fork --mount-proc cannot run here: " +
                      (probe.stderr.strip()[-200:] if ns else "no unshare"))
            return
        secs = self.quick(6.0, 3.0)
        if self.stub:
            # `child/1`: unshare's child, the worker (its host pid).
            self.scenario(f"{STUB_GPU} energy_step_ms=100 sample_ms=200 settle_ms=1000 {STUB_LOAD} "
                          "procs=child/1:80:1024@300-600000\n")
        self.settle()
        rec, _ = self.wattprof(["run", "--interval", "1s"], ns + self.me() + ["--worker", "busy", "0", str(secs)],
                               "pid-namespace", host_model=True)
        d = gpu_domain(rec)
        share = tree_gpu_j(rec) / above_idle(rec) if above_idle(rec) > 0 else 0.0
        self.record(step, "the tree's GPU J / (measured - idle), the job in its own PID namespace", share, ">= 0.95",
                    share >= 0.95, note=f"measured {d['measured_j']:.1f} J, idle {d['idle_j']:.1f}, "
                                        f"unattributed {d['unattributed_j']:.1f}")

    def mps(self):
        step = "mps"
        secs = self.quick(10.0, 4.0)
        env, ctl = None, None
        if self.stub:
            # The server is this process (a holder outside the tree); the
            # turns' two children are its clients, here at work together
            # (as MPS lets them), at 60% and 30% SM: 2:1 in every period,
            # where turns of 300 ms are 2:1 only over whole cycles.
            self.scenario(f"{STUB_GPU} energy_step_ms=100 sample_ms=200 {STUB_LOAD} mps_server={os.getpid()}:512 "
                          "procs=child/1:60:1024%mps,child/2:30:1024%mps\n")
        else:
            ctl = shutil.which("nvidia-cuda-mps-control")
            if not ctl:
                self.skip(step, "no nvidia-cuda-mps-control on PATH")
                return
            running = []
            for q in os.listdir("/proc"):
                try:
                    with open(f"/proc/{q}/comm") as f:
                        if f.read().startswith("nvidia-cuda-mps"):
                            running.append(q)
                except OSError:
                    continue
            if running:
                self.skip(step, f"an MPS daemon already runs (pids {running}): left alone")
                return
            # A daemon of the check's own (its pipe and log in the check's
            # directory): the GPU's settings as they are, compute mode too.
            pipe, log = os.path.join(self.tmp, "mps-pipe"), os.path.join(self.tmp, "mps-log")
            os.makedirs(pipe)
            os.makedirs(log)
            env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=log)
            p = subprocess.run([ctl, "-d"], env=env, capture_output=True, text=True, timeout=30)
            if p.returncode != 0:
                why = (p.stderr or p.stdout).strip()[-200:]
                self.skip(step, f"nvidia-cuda-mps-control -d: exit {p.returncode}: {why}")
                return
        try:
            self.settle()
            rec, lines = self.wattprof(["run", "--interval", "1s"], self.me() + ["--worker", "turns", str(secs)],
                                       "mps", host_model=True, env=env)
        finally:
            if ctl:
                q = subprocess.run([ctl], input="quit\n", env=env, capture_output=True, text=True, timeout=30)
                time.sleep(1.0)
                self.record(step, "the MPS daemon stopped (echo quit | nvidia-cuda-mps-control)", q.returncode,
                            "exit 0", q.returncode == 0, note=(q.stderr or q.stdout).strip()[-200:])
        kids = [x for x in lines if "busy_s" in x]
        pids = [k["pid"] for k in kids]
        dyn, whole, n = dynamic_split(rec, pids, self.cal.get("held_w", 0.0))
        busy = [k["busy_s"] for k in kids]
        if len(pids) != 2 or min(dyn.values()) <= 0 or min(busy) <= 0:
            self.record(step, "both MPS clients' dynamic GPU J", 0.0, "both > 0", False,
                        note=f"dynamic {dyn}, whole {whole}")
            return
        # On the stub its scenario's 2:1 (the stand-ins only sleep).
        ratio, truth = dyn[pids[0]] / dyn[pids[1]], 2.0 if self.stub else busy[0] / busy[1]
        off = abs(ratio / truth - 1)
        self.record(step, f"two MPS clients: dynamic GPU J {ratio:.3f}:1 vs busy {truth:.3f}:1", off, "within 5%",
                    off < 0.05, note=f"whole J {[round(whole[p], 2) for p in pids]}, {n} intervals")

    # -------------------------------------- the first check's steps ---

    def nvml_raw(self):
        step = "nvml"
        if self.stub:
            self.scenario(f"{STUB_GPU} energy_step_ms=20 "
                          "sample_ms=167 load=60000:20000:2000 garbage=pid0,sm_over "
                          "procs=child:50:1024\n")
        secs = self.quick(5.0, 2.0)
        load = self.background_load(secs + 5)
        time.sleep(1.0)
        with self.nvml() as n:
            self.nvml_raw_with(step, n, secs, load)

    def nvml_raw_with(self, step, n, secs, load):
        # The counter's update period: distinct values polled every 1 ms.
        changes, last, t_end = [], n.energy_mj(), time.monotonic() + secs / 2
        while time.monotonic() < t_end:
            v = n.energy_mj()
            if v != last:
                changes.append(time.monotonic())
                last = v
            time.sleep(0.001)
        period = statistics.median(b - a for a, b in zip(changes, changes[1:])) * 1e3 if len(changes) > 2 else float("inf")
        self.record(step, "energy counter update period", period, "<= 105 ms (NVML: 20-100 ms)", period <= 105.0, "ms")
        # Per-process samples every 100 ms.
        last_seen, calls, not_found, raw, lags = 0, 0, 0, [], []
        t_end = time.monotonic() + secs / 2
        while time.monotonic() < t_end:
            rc, s = n.samples(last_seen)
            calls += 1
            if rc == NVML_ERROR_NOT_FOUND:
                not_found += 1
            now_us = time.time() * 1e6
            # How old each new sample is when first returned: the driver's
            # publication lag (a late one is skipped by a lastSeen that
            # another process's newer sample has already moved past).
            lags += [(now_us - x.timeStamp) / 1e3 for x in s if x.pid and x.timeStamp > last_seen]
            raw += s
            sane = [x.timeStamp for x in s if x.pid and x.smUtil <= 100 and x.timeStamp <= now_us + 1e6]
            if sane:
                last_seen = max(last_seen, max(sane))
            time.sleep(0.1)
        # Then a call a second: does NVML return every sample since the
        # last seen, or each process's latest only? (At 1 s intervals the
        # latter makes a share the last sample period's, not the interval's.)
        per_call = []
        for _ in range(2):
            time.sleep(1.0)
            rc, s = n.samples(last_seen)
            mine = [x for x in s if x.pid and x.smUtil <= 100 and x.timeStamp > last_seen]
            if mine:
                per_call.append(len(mine) / len({x.pid for x in mine}))
                last_seen = max(x.timeStamp for x in mine)
        self.finish(load)
        self.record(step, "NOT_FOUND at 100 ms", not_found / max(calls, 1), "recorded (no bound)", None,
                    note=f"{not_found} of {calls} calls")
        if per_call:
            self.record(step, "samples per process in a call a second apart", statistics.median(per_call),
                        "recorded (no bound)", None,
                        note="1: NVML gives each process's latest sample only; ~5 at 200 ms: every sample")
        if lags:
            self.record(step, "a new sample's age when first returned (median)", statistics.median(lags),
                        "recorded (no bound)", None, "ms", note=f"max {max(lags):.0f} ms over {len(lags)} samples")
        now_us = time.time() * 1e6
        offsets = [now_us - x.timeStamp for x in raw if x.pid]
        off = statistics.median(offsets) / 1e6 if offsets else float("nan")
        self.record(step, "sample timestamp: CPU time, µs since the epoch (median age)", off,
                    "0 to 30 s old", 0 <= off <= 30, "s")
        # The driver's own sampling period: the spacing of one process's
        # distinct sample timestamps.
        per_pid = {}
        for x in raw:
            if x.pid and x.smUtil <= 100:
                per_pid.setdefault(x.pid, set()).add(x.timeStamp)
        gaps = [(b - a) / 1e3 for ts in per_pid.values() for a, b in zip(sorted(ts), sorted(ts)[1:])]
        gap = statistics.median(gaps) if gaps else float("nan")
        sm = sorted({x.smUtil for x in raw if x.pid and x.smUtil <= 100})
        self.record(step, "driver's per-process sample period (median spacing)", gap, "recorded (no bound)", None,
                    "ms", note=f"{len(gaps) + len(per_pid)} samples of {len(per_pid)} pids; SM values {sm[:12]}")
        bad = {"pid 0": sum(1 for x in raw if x.pid == 0),
               "SM over 100": sum(1 for x in raw if x.smUtil > 100),
               "future": sum(1 for x in raw if x.timeStamp > now_us + 1e6)}
        self.record(step, "samples that cannot be true", sum(bad.values()), "recorded (wattprof discards them)",
                    None, note=json.dumps(bad))

    def counter_vs_instant(self):
        step = "counter vs instant power"
        if self.stub:
            self.scenario(f"{STUB_GPU} power_mw=150000 power_step_ms=1500:250000\n")
        # 30 s: the counter steps every 100 ms, so 0.3% of it; the H200's
        # four runs of 60 s were within 0.07%.
        secs = self.quick(30.0, 4.0)
        load = self.background_load(secs + 2)
        with self.nvml() as n:
            self.counter_vs_instant_with(step, n, secs, load)

    def counter_vs_instant_with(self, step, n, secs, load):
        time.sleep(1.0)
        e0, t_prev, p_prev, joules = n.energy_mj(), time.monotonic(), n.instant_mw(), 0.0
        t_end = t_prev + secs
        while time.monotonic() < t_end:
            time.sleep(0.01)
            t, p = time.monotonic(), n.instant_mw()
            joules += (p + p_prev) / 2 / 1e3 * (t - t_prev)
            t_prev, p_prev = t, p
        counter = (n.energy_mj() - e0) / 1e3
        self.finish(load)
        diff = abs(counter - joules) / counter if counter else float("inf")
        self.record(step, f"counter {counter:.1f} J vs instant power integrated {joules:.1f} J over {secs:.0f} s",
                    diff, "within 5%", diff < 0.05)

    def turns(self):
        step = "two processes 2:1"
        secs = self.quick(15.0, 4.0)
        for interval in ("1s", "100ms"):
            if self.stub:
                # The stand-in GPU, as an H200 on driver 580 behaves: A works
                # 200 ms of every 300 and B the other 100 (the stub's own
                # cycle, as the children's), the driver samples every 200 ms,
                # each sample the mean over its period, and a call returns
                # each process's newest sample only.
                self.scenario(f"{STUB_GPU} energy_step_ms=100 sample_ms=200 "
                              "load=40000:15000:2000 "
                              "procs=child/1:90:1024~0-200/300,child/2:90:1024~200-300/300\n")
            # At 1 s, the check's own record of every sample NVML gives
            # during the turns (asked every 50 ms, 2 s back, repeats left
            # out): how many each process gets, their SM, and how late each
            # is published; does one process's sample come after the
            # other's newer one?
            n = self.nvml() if interval == "1s" else None
            watch = SampleWatch(n) if n else None
            try:
                rec, lines = self.wattprof(["run", "--interval", interval],
                                           self.me() + ["--worker", "turns", str(secs)], f"turns-{interval}")
            finally:
                raw = watch.stop() if watch else None
                if n:
                    n.close()
            kids = [x for x in lines if "busy_s" in x]
            if raw is not None:
                self.sample_figures(step, raw, [k["pid"] for k in kids])
            by_pid = {p["pid"]: p for p in rec["processes"]}
            j = [by_pid.get(k["pid"], {}).get("energy", {}).get("gpu_j", 0.0) for k in kids]
            busy = [k["busy_s"] for k in kids]
            if len(j) != 2 or min(j) <= 0 or min(busy) <= 0:
                self.record(step, f"{interval}: both processes' GPU energy", 0.0, "both > 0", False, note=str(j))
                continue
            ratio_j, ratio_t = j[0] / j[1], busy[0] / busy[1]
            off = abs(ratio_j / ratio_t - 1)
            self.record(step, f"{interval}: GPU J {j[0]:.2f}:{j[1]:.2f} = {ratio_j:.3f} vs busy {ratio_t:.3f}",
                        off, "within 10%", off < 0.10,
                        note=f"dynamic {[round(x, 2) for x in j]} J, busy {[round(x, 2) for x in busy]} s")

    def sample_figures(self, step, raw, pids):
        """What NVML's samples of the two turn-takers were (SampleWatch).
        Recorded only, and never a reason for the step's own figures to
        be lost. (Against the stub the watch's NVML has its own clock, so
        its figures describe the stub, not wattprof's run.)"""
        try:
            with open(os.path.join(self.out, "turns-samples.json"), "w") as f:
                json.dump([{"pid": p, "ts_us": t, "sm": sm, "seen_us": seen} for p, t, sm, seen in raw], f)
            per = {}
            for pid in pids:
                mine = [r for r in raw if r[0] == pid]
                if mine:
                    per[pid] = (len(mine), statistics.mean(r[2] for r in mine),
                                [(r[3] - r[1]) / 1e3 for r in mine])
            if len(per) == 2:
                (na, sa, la), (nb, sb, lb) = (per[p] for p in pids)
                self.record(step, "1s: NVML samples of A : B (count, mean SM)", na / nb, "recorded (no bound)",
                            None, note=f"A {na} at {sa:.1f}% SM, B {nb} at {sb:.1f}%; SM-sum ratio "
                                       f"{na * sa / (nb * sb) if nb * sb else float('inf'):.3f}")
                self.record(step, "1s: a sample's publication lag (median A, B; max of all)",
                            statistics.median(la), "recorded (no bound)", None, "ms",
                            note=f"A {statistics.median(la):.0f} ms, B {statistics.median(lb):.0f} ms, "
                                 f"max {max(la + lb):.0f} ms (wattprof asks 1,000 ms back)")
            else:
                self.record(step, "1s: NVML samples of the two processes", len(raw), "recorded (no bound)", None,
                            note=f"samples of {sorted(per)} among {pids}")
            # Samples that came back only because the watch asked back:
            # another process's newer sample had been seen first.
            late = sum(1 for i, r in enumerate(raw) if any(q[1] > r[1] and q[3] < r[3] for q in raw[:i]))
            self.record(step, "1s: samples published after another's newer one", late, "recorded (no bound)",
                        None, note=f"of {len(raw)}; a call asking from the newest seen never gets these")
        except Exception as e:  # noqa: BLE001 (recorded, the step goes on)
            self.record(step, "1s: NVML samples of the two processes", 0.0, "recorded (no bound)", None,
                        note=f"could not be summed: {e}")

    def idle_and_held(self):
        step = "idle and held power"
        secs = self.quick(20.0, 12.0)
        if self.stub:
            self.scenario(f"{STUB_GPU} energy_step_ms=100 {STUB_LOAD}\n")
        rec, _ = self.wattprof(["monitor", "--duration", f"{self.quick(secs / 2, 4):.0f}s"], None, "idle")
        g = next(d for d in rec["energy"]["domains"] if d["domain"] == "gpu")
        self.record(step, "idle GPU: mean power", g["avg_power_w"], "recorded; all of it idle",
                    abs(g["idle_j"] - g["measured_j"]) < 1e-6, "W")
        if self.stub:
            self.scenario(f"{STUB_GPU} energy_step_ms=100 {STUB_LOAD} "
                          "procs=child:0:1024@8000-600000\n")
        # 8 s with no context (wattprof's start, a second to settle, then a
        # stretch long enough that a counter stepping every 100 ms puts the
        # idle power off by under 2%), then a context and no work.
        rec, lines = self.wattprof(["run", "--interval", "250ms"],
                                   self.me() + ["--worker", "hold", "8", str(secs - 2)], "hold")
        gpus = [i["gpus"][0] for i in rec.get("intervals", []) if i.get("gpus")]
        idle_w = next((g["idle_w"] for g in reversed(gpus) if "idle_w" in g), float("nan"))
        held_w = next((g["held_w"] for g in reversed(gpus) if "held_w" in g), float("nan"))
        if self.stub:
            # The stand-in's own figures: 31.7 W idle, 22.3 W held.
            self.record(step, "learned idle power", idle_w, "within 5% of the stub's 31.7 W",
                        abs(idle_w / 31.7 - 1) < 0.05, "W")
            self.record(step, "learned held power (a context, no work)", held_w,
                        "within 10% of the stub's 22.3 W", abs(held_w / 22.3 - 1) < 0.10, "W")
        else:
            # Against the steady power of each phase of this run: the mean
            # of NVML's power readings (each the mean over the last second)
            # over the later half of the time with no context, and with
            # one. Not the counter's energy over those rows: it steps 8 J
            # at a time (100 ms at 80 W), so a 5 s half is ±1.6 W off.
            def steady(rows):
                rows = [r for r, _ in rows[len(rows) // 2:] if r.get("power_w") is not None]
                return statistics.mean(r["power_w"] for r in rows) if rows else float("nan")
            rows = [(i["gpus"][0], i["duration_ns"]) for i in rec.get("intervals", []) if i.get("gpus")]
            held_at = [n for n, (g, _) in enumerate(rows) if g.get("processes")] or [len(rows)]
            # Before the first context, and while it was held (the exit's
            # intervals after it left out).
            idle_s = steady(rows[:held_at[0]])
            held_s = steady(rows[held_at[0]:held_at[-1] + 1]) - idle_s
            self.steady_held_w = held_s
            off = abs(idle_w / idle_s - 1)
            self.record(step, f"learned idle power vs the steady {idle_s:.2f} W", idle_w, "within 2%", off < 0.02, "W")
            off = abs(held_w / held_s - 1)
            self.record(step, f"learned held power (a context, no work) vs the steady {held_s:.2f} W", held_w,
                        "within 5%", off < 0.05, "W")
        # A holder, and a busy process beside it. With the calibrated host
        # model the held power is known from the start: the holder 1 s in,
        # the busy one 2 s later. Without, wattprof must learn both first:
        # the holder 9 s in (the idle figure needs a stretch of 2 s after
        # wattprof's start, its first interval, a second settling and a
        # second of tail; at 5 s, a loaded machine (wattprof's start took
        # 2 s) learned none, and the holder was charged all 54 W as held),
        # and the busy one 6 s after it. Then both for 5-10 s.
        delay, after, both = (1, 2, self.quick(10, 5)) if self.hm else (9, 6, secs - 1)
        if self.stub:
            a, b = delay * 1000, (delay + after) * 1000
            self.scenario(f"{STUB_GPU} energy_step_ms=100 {STUB_LOAD} sample_ms=167 "
                          f"procs=child/1:0:1024@{a}-600000,child/2:0:1024@{b}-{b + 500},"
                          f"child/2:80:1024@{b + 500}-600000\n")
        self.settle()
        rec, lines = self.wattprof(["run", "--interval", "250ms"],
                                   self.me() + ["--worker", "beside", str(delay), str(after + both), str(after)],
                                   "beside", host_model=True)
        holder = next((x for x in lines if "held_s" in x), None)
        p = next((q for q in rec["processes"] if holder and q["pid"] == holder["pid"]), None)
        figs = [i["gpus"][0]["held_w"] for i in rec.get("intervals", []) if i.get("gpus") and "held_w" in i["gpus"][0]]
        held = figs[-1] if figs else self.cal.get("held_w")
        if p is None or held is None:
            self.record(step, "holder beside a busy process", 0.0, "found", False)
            return
        # While the other works: the holder's GPU energy per second against
        # half the held power (two holders).
        per_s = []
        for i in rec["intervals"]:
            procs = {q["pid"]: q["sm_util_pct"] for q in (i.get("gpus") or [{}])[0].get("processes", [])}
            if len(procs) == 2 and procs.get(holder["pid"]) == 0 and max(procs.values()) > 0:
                row = next((q for q in i.get("processes", []) if q["pid"] == holder["pid"]), None)
                if row:
                    per_s.append(row.get("gpu_j", 0.0) / (i["duration_ns"] / 1e9))
        w = statistics.median(per_s) if per_s else float("nan")
        # Against half the held power: the stub's own, or on a GPU the
        # steady one measured in the step before (not wattprof's figure).
        truth = STUB_HELD_W if self.stub else getattr(self, "steady_held_w", held)
        off = abs(w / (truth / 2) - 1) if truth > 0 and per_s else float("inf")
        self.record(step, f"holder beside a busy process: {w:.2f} W vs held/2 {truth / 2:.2f} W", off,
                    "within 20%", off < 0.20,
                    note=f"{len(per_s)} intervals; wattprof's held figure {held:.2f} W"
                         f" ({'calibrated host model' if self.hm else 'learned'})")

    def overhead(self):
        step = "overhead"
        rounds = self.quick(self.args.rounds, 3)
        if self.stub:
            self.scenario(f"{STUB_GPU} power_mw=60000\n")
            n = 40
        else:
            # A fixed job of about 5 s of GPU work (so wattprof's start-up,
            # about a second, is part of the cost but not all of it).
            rc, out, err = self.call(self.me() + ["--worker", "job", "2000"])
            if rc != 0:
                raise RuntimeError(f"the job: exit {rc}: {err.strip()[-300:]}")
            took = self.lines(out)[-1]["compute_s"]
            n = max(2000, int(2000 * self.quick(5.0, 3.0) / max(took, 1e-3)))
        alone, under, gpu_alone, gpu_under = [], [], [], []

        def compute_s(lines):
            return next((x["compute_s"] for x in lines if "compute_s" in x), None)

        job = self.me() + ["--worker", "job", str(n)]
        for _ in range(rounds):
            t = time.monotonic()
            rc, out, err = self.call(job)
            if rc != 0:
                raise RuntimeError(f"the job: exit {rc}: {err.strip()[-300:]}")
            alone.append(time.monotonic() - t)
            gpu_alone.append(compute_s(self.lines(out)))
            t = time.monotonic()
            _, lines = self.wattprof(["run"], job, "overhead")
            under.append(time.monotonic() - t)
            gpu_under.append(compute_s(lines))
        ratio = statistics.median(u / a for a, u in zip(alone, under))
        per_round = [round(u / a, 4) for a, u in zip(alone, under)]
        if self.stub:
            self.record(step, f"job under wattprof run / alone, median of {rounds} rounds", ratio,
                        "recorded (stub: CPU job, wattprof start-up)", None,
                        note=f"alone {statistics.median(alone):.3f} s, under {statistics.median(under):.3f} s; "
                             f"per round {per_round}")
            return
        # The GPU work itself, timed by the job: what wattprof costs a
        # training step. The whole process (CUDA's start, wattprof's start
        # and its final report included) is recorded beside it.
        gpu = statistics.median(u / a for a, u in zip(gpu_alone, gpu_under))
        self.record(step, f"the job's GPU work under wattprof run / alone, median of {rounds} rounds", gpu,
                    "<= 1.02", gpu <= 1.02,
                    note=f"alone {statistics.median(gpu_alone):.3f} s, under {statistics.median(gpu_under):.3f} s; "
                         f"per round {[round(u / a, 4) for a, u in zip(gpu_alone, gpu_under)]}")
        self.record(step, "the whole job (CUDA start-up, wattprof's start and report) under wattprof run / alone",
                    ratio, "recorded (no bound)", None,
                    note=f"alone {statistics.median(alone):.3f} s, under {statistics.median(under):.3f} s "
                         f"(+{statistics.median(u - a for a, u in zip(alone, under)):.2f} s); per round {per_round}")

    # ----------------------------------------------------------- plan ---

    def plan(self):
        """The steps in order, the key figures first: (name, method, the
        seconds it takes in full and in --quick, with margin: a step is
        skipped when its figure no longer fits). Full, on an H100 or H200
        (estimated): the key figures by about 2 minutes (calibrate 15 s,
        training 56, time-slicing 27, context at 1 s 14), about 400 s in
        all; the estimates add up to 460. --stub --quick: about 2 minutes on
        2 CPUs (calibrate 8 s, training 4, time-slicing 8, context 5,
        samples 14, physics 10, short 6, pid namespace 4, MPS 6, nvml 7,
        counter 6, 2:1 13, idle and held 32, overhead 3)."""
        return [("gpu state", self.gpu_state, 2, 2),
                ("calibrate", self.calibrate, 20, 14),
                ("training job", self.training, 70, 30),
                ("time-slicing", self.time_slicing, 35, 25),
                ("context at 1 s", self.context_at_1s, 16, 10),
                ("what a sample means", self.sample_meaning, 28, 20),
                ("holder physics", self.holder_physics, 33, 20),
                ("short jobs", self.short_jobs, 11, 10),
                ("pid namespace", self.pid_namespace, 13, 9),
                ("mps", self.mps, 20, 12),
                ("nvml", self.nvml_raw, 12, 8),
                ("counter vs instant power", self.counter_vs_instant, 35, 8),
                ("two processes 2:1", self.turns, 45, 20),
                ("idle and held power", self.idle_and_held, 60, 45),
                ("overhead", self.overhead, 60, 25)]

    def run(self):
        def stopped(signum, _frame):
            raise SystemExit(128 + signum)

        # Stopped from outside: what was measured is written, and what the
        # check started is stopped (a worker must not hold the GPU on).
        signal.signal(signal.SIGTERM, stopped)
        try:
            for name, fn, full, quick in self.plan():
                est = self.quick(full, quick)
                started = time.monotonic() - self.t_start
                if self.args.only and name not in self.args.only:
                    self.skip(name, "not asked for (--only)")
                    self.steps.append({"step": name, "status": "skipped", "started_s": round(started, 1)})
                    continue
                if self.left() < est:
                    self.skip(name, f"the budget: {max(0.0, self.left()):.0f} s left of {self.args.budget_s:.0f}, "
                                    f"the step takes about {est} s")
                    self.steps.append({"step": name, "status": "skipped", "started_s": round(started, 1)})
                    continue
                status = "ran"
                try:
                    fn()
                except Cut as e:
                    status = "cut"
                    self.skip(name, f"cut short: {e}")
                except Exception as e:  # a step that cannot run is a failure, said
                    status = "error"
                    self.record(name, "ran", 0.0, "runs", False, note=f"{type(e).__name__}: {str(e)[-300:]}")
                self.steps.append({"step": name, "status": status, "started_s": round(started, 1),
                                   "took_s": round(time.monotonic() - self.t_start - started, 1), "estimate_s": est})
                self.write(False)
            self.settings_unchanged()
            self.write(True)
        finally:
            for p in list(self.live):
                self.stop(p)
            shutil.rmtree(self.tmp, ignore_errors=True)
        s = self.summary(True)
        print(f"gpu-check: {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped "
              f"({s['recorded']} figures recorded with no bound) in {s['elapsed_s']:.0f} s", flush=True)
        return 0 if s["failed"] == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--wattprof", default=shutil.which("wattprof") or "./wattprof",
                    help="the wattprof binary (default: on PATH, else ./wattprof)")
    ap.add_argument("--out", default="gpu-check", help="where the summary and recordings go")
    ap.add_argument("--quick", action="store_true", help="short steps (CI), not the full durations")
    ap.add_argument("--budget-s", type=float, default=470.0,
                    help="the whole check's time: steps that no longer fit are skipped, and the one running "
                         "at the deadline is stopped (default 470: under 8 minutes)")
    ap.add_argument("--rounds", type=int, default=3, help="overhead rounds (alone, then under wattprof)")
    ap.add_argument("--only", type=lambda v: [x.strip() for x in v.split(",")], default=None,
                    metavar="STEP,STEP", help="run these steps only (by name, as the summary gives them)")
    ap.add_argument("--stub", metavar="LIB", help="wattprof's NVML stub (libnvml_stub.so): no GPU, no PyTorch")
    ap.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.stub is not None)
    if not os.access(args.wattprof, os.X_OK):
        print(f"gpu-check: no wattprof binary at {args.wattprof}: give --wattprof PATH", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("gpu-check: wattprof loads eBPF programs: run as root", file=sys.stderr)
        return 2
    if args.stub is None:
        # In a child: a CUDA context in this process would hold the GPU
        # through every step.
        probe = subprocess.run([sys.executable, "-c", "import torch; torch.cuda.init(); "
                                "assert torch.cuda.is_available()"], capture_output=True, text=True)
        if probe.returncode != 0:
            print(f"gpu-check: PyTorch with CUDA is needed on a GPU machine "
                  f"({probe.stderr.strip().splitlines()[-1:] or ['no output']}); "
                  "or --stub LIB to check against wattprof's NVML stub", file=sys.stderr)
            return 2
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main() or 0)
