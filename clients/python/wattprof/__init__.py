"""Energy of code windows, measured by wattprof.

Run the program under ``wattprof run``; wattprof sets ``WATTPROF_SOCKET``.
A window is a ``begin NAME`` datagram, then an ``end NAME`` datagram sent
from a socket with an address, which wattprof answers with the window's
figures as its recording holds them (JSON), or ``{"error": ...}``.

Without ``WATTPROF_SOCKET`` (a program not started by ``wattprof run``),
windows go to a wattprof daemon (``wattprof monitor --serve``) when one
answers at ``WATTPROF_DAEMON`` or ``/run/wattprof/wattprof.sock``: it
measures the calling process's tree over whole intervals (at least 1 s
for a user who is not root), so ``with wattprof.window("train")`` works in
a notebook on a shared server. With neither, every call is a cheap no-op
that returns ``None``.
"""

import functools
import json
import os
import socket
import threading
import warnings

__all__ = [
    "Measurement",
    "WattprofError",
    "active",
    "begin_window",
    "end_window",
    "measure",
    "window",
]

ENV = "WATTPROF_SOCKET"
DAEMON_ENV = "WATTPROF_DAEMON"
DAEMON_PATH = "/run/wattprof/wattprof.sock"
DEFAULT_TIMEOUT_S = 10.0

_lock = threading.Lock()
_sender = None
# The daemon connection: None before the first try, False when none answers.
_daemon = None
_daemon_pid = None
_next_id = 0
# Windows begun on the daemon's current connection (a new connection, after
# a daemon restart, holds none of the old one's).
_begun = {}


class WattprofError(RuntimeError):
    """wattprof refused a window message (e.g. ``end`` of a window never begun)."""


_FIGURES = frozenset(
    [
        "energy_j",
        "duration_s",
        "package_j",
        "core_j",
        "dram_j",
        "gpu_j",
        "co2_g",
        "avg_power_w",
        "cpu_time_s",
        "machine",
        "raw",
        "total_energy",
        "time",
    ]
)


class Measurement:
    """A finished window, as wattprof's recording holds it.

    energy_j     energy attributed to the program's process tree (J)
    duration_s   the window's length (s)
    package_j, dram_j, gpu_j, core_j   that energy per domain (J); None for
                 a domain with no reader here (never 0)
    co2_g        its CO2 equivalent (g)
    cpu_time_s   the tree's CPU time in the window (s)
    machine      the whole machine's energy per domain: a list of dicts
                 (domain, package, measured_j, avg_power_w, estimated)
    estimated    True when any of the machine's figures is a power model's
                 estimate (no energy counter), not a measurement
    raw          the JSON object wattprof sent
    """

    def __init__(self, raw):
        self.raw = raw
        energy = raw.get("energy", {})
        self.name = raw.get("name")
        self.energy_j = energy.get("total_j")
        self.package_j = energy.get("package_j")
        self.core_j = energy.get("core_j")
        self.dram_j = energy.get("dram_j")
        self.gpu_j = energy.get("gpu_j")
        self.co2_g = energy.get("co2_g")
        self.avg_power_w = energy.get("avg_power_w")
        self.duration_s = (raw.get("end_ns", 0) - raw.get("begin_ns", 0)) / 1e9
        self.cpu_time_s = raw.get("on_cpu_ns", 0) / 1e9
        self.machine = raw.get("machine", [])
        self.estimated = any(d.get("estimated", False) for d in self.machine)

    # Zeus's Measurement names.
    @property
    def total_energy(self):
        return self.energy_j

    @property
    def time(self):
        return self.duration_s

    def __repr__(self):
        return "Measurement(name=%r, energy_j=%r, duration_s=%r%s)" % (
            self.name,
            self.energy_j,
            self.duration_s,
            ", estimated" if self.estimated else "",
        )


def active():
    """Whether windows are measured: under ``wattprof run``, or by a daemon."""
    return bool(os.environ.get(ENV)) or _connection() is not None


def _connection():
    """The daemon's connection (made once per process), or None."""
    global _daemon, _daemon_pid
    with _lock:
        if _daemon_pid != os.getpid():
            # A fork must not share its parent's connection.
            _daemon, _daemon_pid = None, os.getpid()
            _begun.clear()
        if _daemon is None:
            path = os.environ.get(DAEMON_ENV) or DAEMON_PATH
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                _daemon = (s, s.makefile("rb"))
            except OSError:
                s.close()
                _daemon = False
        return _daemon or None


def _ask(line, timeout):
    """Sends one request to the daemon and returns its answer (a dict)."""
    global _next_id, _daemon
    conn = _connection()
    if conn is None:
        return None
    s, lines = conn
    with _lock:
        _next_id += 1
        rid = _next_id
        s.settimeout(timeout)
        try:
            s.sendall(("%s id=%d\n" % (line, rid)).encode())
            while True:
                raw = lines.readline()
                if not raw:
                    raise OSError("the wattprof daemon closed the connection")
                answer = json.loads(raw.decode())
                if answer.get("id") == rid:
                    return answer
        except (OSError, ValueError) as e:
            # A timeout, a daemon restarted or gone, a garbled line: this
            # connection is done (the next call connects again); the
            # program goes on.
            _daemon = None
            _begun.clear()
            try:
                s.close()
            except OSError:
                pass
            warnings.warn(
                "the wattprof daemon did not answer `%s`: %s" % (line, e),
                stacklevel=3,
            )
            return None


def _sync(sync):
    if sync is None:
        return
    if sync == "torch":
        try:
            import torch  # noqa: PLC0415 (optional, only when asked for)
        except ImportError:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    elif callable(sync):
        sync()
    else:
        raise ValueError("sync must be None, 'torch' or a callable, not %r" % (sync,))


def _check_name(name):
    if not name or any(c.isspace() for c in name):
        raise ValueError("a window name is one word without spaces, not %r" % (name,))


def _send_begin(path, name):
    global _sender
    with _lock:
        if _sender is None:
            _sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        _sender.sendto(("begin %s" % name).encode(), path)


def begin_window(name, sync=None):
    """Begins window ``name`` (``sync``: None, ``"torch"``, or a callable run first)."""
    path = os.environ.get(ENV)
    if not path:
        if _connection() is None:
            return None
        _check_name(name)
        _sync(sync)
        answer = _ask("begin %s" % name, DEFAULT_TIMEOUT_S)
        if answer and "error" in answer:
            # Refused (the rate, the open windows' limit): the program goes
            # on, and its `end` returns None.
            warnings.warn("wattprof: %s" % answer["error"], stacklevel=2)
        elif answer:
            _begun[name] = _begun.get(name, 0) + 1
        return None
    _check_name(name)
    _sync(sync)
    _send_begin(path, name)
    return None


def end_window(name, sync=None, timeout=DEFAULT_TIMEOUT_S):
    """Ends window ``name`` and returns its ``Measurement`` (``None`` outside wattprof).

    Raises ``WattprofError`` when wattprof refuses the end (no such window).
    If no answer comes within ``timeout`` seconds (a wattprof too old to
    answer), warns and returns ``None``.
    """
    path = os.environ.get(ENV)
    if not path:
        if _connection() is None:
            return None
        _check_name(name)
        _sync(sync)
        if not _begun.get(name):
            # Its begin was refused, or the daemon restarted since: nothing
            # to end on this connection.
            warnings.warn(
                "wattprof: window %r was not begun on the daemon's connection" % (name,),
                stacklevel=2,
            )
            return None
        _begun[name] -= 1
        # The daemon answers after its next interval closes.
        answer = _ask("end %s" % name, timeout + 3600.0)
        if answer is None:
            return None
        if "error" in answer:
            raise WattprofError(answer["error"])
        return Measurement(answer["window"])
    _check_name(name)
    _sync(sync)
    # A socket of its own per end, bound to an abstract address the kernel
    # picks: the answer can only be this end's, whatever other threads do.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.bind("")
        s.settimeout(timeout)
        s.sendto(("end %s" % name).encode(), path)
        try:
            data = s.recv(1 << 16)
        except socket.timeout:
            warnings.warn(
                "wattprof did not answer `end %s` within %s s (an older wattprof "
                "records the window but does not answer)" % (name, timeout),
                stacklevel=2,
            )
            return None
    finally:
        s.close()
    answer = json.loads(data.decode())
    if "error" in answer:
        raise WattprofError(answer["error"])
    return Measurement(answer)


class window:
    """``with wattprof.window("train") as w: ...`` then ``w.energy_j``.

    Outside wattprof the body runs as usual and every figure is ``None``.
    """

    def __init__(self, name, sync=None, timeout=DEFAULT_TIMEOUT_S):
        _check_name(name)
        self.name = name
        self.sync = sync
        self.timeout = timeout
        self.measurement = None

    def __enter__(self):
        begin_window(self.name, sync=self.sync)
        return self

    def __exit__(self, *exc):
        self.measurement = end_window(self.name, sync=self.sync, timeout=self.timeout)
        return False

    def __getattr__(self, attr):
        # The finished window's figures; None outside wattprof (or before
        # the end), as every call is a no-op there.
        if attr not in _FIGURES:
            raise AttributeError(attr)
        m = self.__dict__.get("measurement")
        return None if m is None else getattr(m, attr)


def measure(name, sync=None, timeout=DEFAULT_TIMEOUT_S):
    """Decorator: every call of the function is window ``name``.

    The last call's ``Measurement`` is on the wrapper as ``.last``.
    """

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with window(name, sync=sync, timeout=timeout) as w:
                result = fn(*args, **kwargs)
            inner.last = w.measurement
            return result

        inner.last = None
        return inner

    return wrap
