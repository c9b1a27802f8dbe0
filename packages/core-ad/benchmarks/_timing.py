"""Shared helpers for the workspace's benchmarks (core_ad's, and the sibling packages' which
import this file by path): timing, alternating runs, machine info, tables.

Conventions (see PRACTICES.md, "Benchmarks"):

* every case is timed in the same process, on the same inputs, dtype and thread count;
* cases are interleaved per repeat (``compare``), with the order rotated each repeat so that
  no case always runs right after the same neighbour;
* warm-up calls are not timed; the first call of a JIT/compiled case is timed separately by
  the caller (``time_first_call``) and never mixed into the steady-state median;
* the reported figure is the median of ``repeats`` (>= 5) runs.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from typing import Callable


def time_once(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call of ``fn()``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_first_call(fn: Callable[[], object]) -> tuple[float, object]:
    """``(seconds, result)`` of the first call (trace + compile + one run for JIT systems)."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def time_median(fn: Callable[[], object], repeats: int = 7, warmup: int = 2) -> float:
    """Median seconds of ``repeats`` calls of ``fn()`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(time_once(fn) for _ in range(repeats))


def compare(cases: dict[str, Callable[[], object]], repeats: int = 7,
            warmup: int = 1) -> dict[str, dict]:
    """Time several cases alternately: each repeat runs every case once (rotated order).

    Returns ``{name: {"median": s, "min": s, "max": s, "times": [...]}}``. The cores kept
    busy by other processes during the timed runs are left in ``compare.other_load``.
    """
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            cases[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    load = OtherLoad().start()
    for r in range(repeats):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            times[name].append(time_once(cases[name]))
    compare.other_load = load.stop().cores
    return {
        name: {
            "median": statistics.median(ts),
            "min": min(ts),
            "max": max(ts),
            "times": ts,
        }
        for name, ts in times.items()
    }


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name") and model in ("unknown", "", "x86_64"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def _version(modname: str) -> str:
    mod = sys.modules.get(modname)
    if mod is None:
        return "not imported"
    return getattr(mod, "__version__", "?")


def machine_info(extra: str = "", modules=("numpy", "core_ad", "torch", "jax")) -> str:
    """Cores, CPU model and SIMD flags, versions of ``modules`` and thread settings, as text."""
    model, flags = _cpuinfo()
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl") if f in flags]
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    lines = [
        f"machine : {model}; {os.cpu_count()} logical cores ({usable} usable);"
        f" SIMD flags: {', '.join(simd) or 'none of avx2/avx512'}"
        f"{'' if 'avx512f' in flags else ' (no AVX-512)'}",
        f"python  : {platform.python_version()} ({platform.machine()}, {platform.system()})",
        "versions: " + ", ".join(f"{m} {_version(m)}" for m in modules),
    ]
    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                      "OPENBLAS_NUM_THREADS", "XLA_FLAGS") if k in os.environ}
    threads = []
    if sys.modules.get("torch") is not None:
        threads.append(f"torch.get_num_threads()={sys.modules['torch'].get_num_threads()}")
    threads.append("core_ad/numpy elementwise ops: 1 thread")
    if sys.modules.get("jax") is not None:
        if "intra_op_parallelism_threads=1" in os.environ.get("XLA_FLAGS", ""):
            threads.append("JAX: XLA CPU limited to 1 thread by XLA_FLAGS")
        else:
            threads.append("JAX: XLA CPU default thread pool (one thread per usable core)")
    lines.append(f"threads : {'; '.join(threads)}; env {env or '{}'}")
    lines.append(load_note())
    if extra:
        lines.append(extra)
    return "\n".join(lines)


def _cpu_times():
    with open("/proc/stat") as fh:
        vals = [int(v) for v in fh.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return sum(vals[:8]), idle


def _own_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class OtherLoad:
    """Cores kept busy by *other* processes between ``start()`` and ``stop()``.

    Busy time from ``/proc/stat`` minus this process's own CPU time (its worker threads, e.g.
    an OpenMP pool still spinning after a parallel region, are not "other processes").
    ``cores`` is None where ``/proc/stat`` cannot be read.
    """

    def __init__(self):
        self.cores = None
        self._t0 = None

    def start(self):
        try:
            self._t0 = (*_cpu_times(), _own_cpu())
        except (OSError, ValueError, IndexError):
            self._t0 = None
        return self

    def stop(self):
        if self._t0 is None:
            return self
        try:
            t1, i1, s1 = *_cpu_times(), _own_cpu()
            hz = os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return self
        t0, i0, s0 = self._t0
        ncpu = os.cpu_count() or 1
        wall = (t1 - t0) / hz / ncpu
        if wall > 0:
            busy = ((t1 - t0) - (i1 - i0)) / hz - (s1 - s0)
            self.cores = max(0.0, busy / wall)
        return self


def busy_cores(interval: float = 0.5) -> float | None:
    """Cores kept busy by other processes over the next ``interval`` seconds (we sleep)."""
    m = OtherLoad().start()
    time.sleep(interval)
    return m.stop().cores


_SAMPLE = object()


def load_note(where: str = "before the run", busy=_SAMPLE) -> str:
    """CPU use by other processes (sampled now unless ``busy`` is given), with a warning."""
    if busy is _SAMPLE:
        busy = busy_cores()
    try:
        load1 = f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        load1 = "?"
    if busy is None:
        return (f"load    : unknown {where} (too short to measure, or no /proc/stat;"
                f" 1-min load average {load1})")
    warn = ""
    if busy > 0.25:
        warn = ("  WARNING: other processes are using the CPU; multi-threaded peers (torch's"
                " OpenMP pool, XLA) suffer most from a busy core, so these timings are noisy")
    return (f"load    : other processes kept {busy:.2f} of {os.cpu_count()} cores busy {where}"
            f" (1-min load average {load1}){warn}")


def apply_thread_count(threads: int) -> str:
    """Make the peers use ``threads`` threads where they can; call before importing jax.

    torch: ``torch.set_num_threads`` (done by the caller after import). JAX: for ``threads == 1``
    the XLA CPU flags ``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` are
    added to ``XLA_FLAGS`` (unless it is already set); otherwise JAX keeps its default.
    """
    if threads == 1 and "XLA_FLAGS" not in os.environ:
        os.environ["XLA_FLAGS"] = (
            "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )
        return "XLA_FLAGS set for one thread"
    return "JAX thread pool left at its default"


def error_reason(e: BaseException, limit: int = 300) -> str:
    """One line saying why ``e`` happened (its first line plus any 'got <Error>' detail)."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    detail = ""
    k = text.find("got ")
    if k > 0 and "Error" in text[k:k + 40]:
        detail = " ... " + text[k:].splitlines()[0]
    return f"{type(e).__name__}: {first}{detail}"[:limit]


def fmt_time(s: float | None) -> str:
    """Seconds as a short human string (us / ms / s)."""
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def print_table(headers: list[str], rows: list[list[object]], title: str = "") -> None:
    """A plain left-aligned text table (markdown-compatible)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if title:
        print(title)

    def line(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        print(line(r))


def max_rel_diff(a, b) -> float:
    """Normwise relative difference ``max|a - b| / max|b|`` (0 when both are all zero)."""
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {b.shape}")
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    if scale == 0.0:
        return diff
    return diff / scale
