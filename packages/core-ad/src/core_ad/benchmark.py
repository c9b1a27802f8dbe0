"""The benchmark harness every package's ``benchmarks/`` scripts use: timing, alternating
runs, machine and load notes, and one summary-table shape with ratios.

Conventions (see docs/ARCHITECTURE.md, "Testing and benchmarking"):

* every case is timed in the same process, on the same inputs, dtype and thread count;
* cases are interleaved per repeat (``compare``), with the order rotated each repeat so that
  no case always runs right after the same neighbour;
* warm-up calls are not timed; the first call of a JIT/compiled case is timed separately by
  the caller (``time_first_call``) and never mixed into the steady-state median;
* the reported figure is the median of ``repeats`` (>= 5) runs, with the range beside it;
* every script ends with :func:`side_by_side` tables: one row per system, its median and
  range, ``this / ours`` (above 1: ours is faster) and its first-call time.

Example::

    from core_ad import benchmark as bench

    first = {"ours": bench.time_first_call(build_ours)[0]}
    res = bench.compare({"ours": run_ours, "torch": run_torch}, repeats=7)
    bench.report_runs(res)
    bench.side_by_side(res, "ours", first_calls=first, title="blur 4096^2 float32")
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from typing import Callable

__all__ = [
    "OtherLoad",
    "add_common_arguments",
    "apply_thread_count",
    "busy_cores",
    "compare",
    "compare_and_report",
    "error_reason",
    "fmt_time",
    "import_peers",
    "load_note",
    "machine_info",
    "max_rel_diff",
    "parse_arguments",
    "print_table",
    "report_agreement",
    "report_first_calls",
    "report_runs",
    "side_by_side",
    "summarize",
    "time_first_call",
    "time_first_calls",
    "time_median",
    "time_once",
    "to_numpy",
]


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


def time_first_calls(cases: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Seconds of the first call of every case (what :func:`report_first_calls` prints)."""
    return {name: time_first_call(fn)[0] for name, fn in cases.items()}


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
    return {name: summarize(ts) for name, ts in times.items()}


compare.other_load = None


def summarize(times: list[float]) -> dict:
    """``{"median", "min", "max", "times"}`` of a list of seconds, as ``compare`` returns."""
    return {"median": statistics.median(times), "min": min(times), "max": max(times),
            "times": list(times)}


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


def add_common_arguments(parser, repeats: int = 7, threads: int = 2) -> None:
    """The options every side-by-side script takes: --repeats, --threads, --no-torch,
    --no-jax, --seed (check them with :func:`parse_arguments`)."""
    parser.add_argument("--repeats", type=int, default=repeats,
                        help=f"timed runs per case (>= 5; {repeats})")
    parser.add_argument("--threads", type=int, default=threads,
                        help=f"threads for the peers ({threads}); 1 also limits JAX to one thread"
                             " via XLA_FLAGS")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    parser.add_argument("--no-jax", action="store_true", help="skip JAX")
    parser.add_argument("--seed", type=int, default=0)


def parse_arguments(parser, argv=None):
    """``parser.parse_args(argv)``, refusing fewer than 5 repeats (a median needs them)."""
    args = parser.parse_args(argv)
    if args.repeats < 5:
        parser.error("--repeats must be >= 5 (median of at least 5 runs)")
    return args


def import_peers(args, notes: list[str]):
    """``(torch, jax)`` as the options of :func:`add_common_arguments` ask (None where skipped
    or not installed, with a line in ``notes``): torch on ``args.threads`` threads, JAX in
    float64 with its thread count set before import."""
    apply_thread_count(args.threads)
    torch = jax = None
    if args.no_torch:
        notes.append("PyTorch skipped (--no-torch)")
    else:
        try:
            import torch

            torch.set_num_threads(args.threads)
        except ImportError as e:
            notes.append(f"PyTorch not available ({e}); skipping the PyTorch cases")
    if args.no_jax:
        notes.append("JAX skipped (--no-jax)")
    else:
        try:
            import jax

            jax.config.update("jax_enable_x64", True)
        except ImportError as e:
            notes.append(f"JAX not available ({e}); skipping the JAX cases")
    return torch, jax


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


def to_numpy(x):
    """A peer's result (torch tensor, JAX or CuPy array, numpy) as a numpy array."""
    import numpy as np

    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    elif hasattr(x, "get") and not isinstance(x, np.ndarray):
        x = x.get()
    return np.asarray(x)


def report_agreement(name: str, diffs: dict[str, float], tol: float, dtype=None,
                     width: int = 22) -> bool:
    """Print one line of normwise relative differences against the reference; True when
    every one is at most ``tol`` (and ``dtype``, when given, is float64)."""
    import numpy as np

    good = all(d <= tol for d in diffs.values())
    if dtype is not None:
        good &= np.dtype(dtype) == np.float64
    cells = "  ".join(f"{k} rel diff {d:.2e}" for k, d in diffs.items())
    kind = f"  dtype {np.dtype(dtype)}" if dtype is not None else ""
    print(f"  {name:{width}s} {cells}{kind}  {'OK' if good else 'MISMATCH'}")
    return good


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


def report_first_calls(first_calls: dict[str, float]) -> None:
    """The first-call times (trace + compile + one run), which no median includes."""
    if not first_calls:
        return
    print("first call (trace + compile + one run), not included in the medians:")
    width = max(len(k) for k in first_calls)
    for name, t in first_calls.items():
        print(f"  {name:{width}s}  {fmt_time(t)}")
    print()


def report_runs(results: dict[str, dict]) -> None:
    """The load during the last :func:`compare` and every case's median and range."""
    print(load_note("on average during the timed runs", compare.other_load))
    print("all runs (median [min .. max]):")
    width = max((len(k) for k in results), default=0)
    for name, r in results.items():
        print(f"  {name:{width}s}  {fmt_time(r['median']):>10s}  [{fmt_time(r['min'])} .."
              f" {fmt_time(r['max'])}]")
    print()


def compare_and_report(cases: dict[str, Callable[[], object]], repeats: int = 7, *,
                       first_calls: dict[str, float] | None = None, warmup: int = 1) -> dict:
    """:func:`report_first_calls`, then :func:`compare`, then :func:`report_runs`."""
    report_first_calls(first_calls or {})
    res = compare(cases, repeats=repeats, warmup=warmup)
    report_runs(res)
    return res


def side_by_side(results: dict[str, dict | None], ours: str, *, title: str = "",
                 first_calls: dict[str, float] | None = None,
                 columns: dict[str, dict[str, object]] | None = None) -> dict[str, float]:
    """Print the summary table every benchmark ends with, and return ``this / ours`` ratios.

    ``results``: ``{system: stats}`` as :func:`compare` or :func:`summarize` return them
    (``None`` for a system that did not finish); ``ours`` names our row, printed first.
    Columns: system, median, [min .. max], ``this / ours`` (above 1: ours is faster), first
    call, then ``columns`` (``{header: {system: cell}}``) for what one benchmark adds.
    """
    if ours not in results or results[ours] is None:
        raise ValueError(f"side_by_side: no result for ours ({ours!r})")
    first_calls = first_calls or {}
    columns = columns or {}
    base = results[ours]["median"]
    ratios, rows = {}, []
    for name in [ours] + [k for k in results if k != ours]:
        r = results[name]
        if r is None:
            cells = [name, "did not finish", "-", "-"]
        else:
            ratios[name] = r["median"] / base
            cells = [name, fmt_time(r["median"]), f"{fmt_time(r['min'])} .. {fmt_time(r['max'])}",
                     f"{ratios[name]:.2f}"]
        cells.append(fmt_time(first_calls[name]) if name in first_calls else "-")
        cells += [str(col.get(name, "-")) for col in columns.values()]
        rows.append(cells)
    print_table(["system", "median", "min .. max", f"this / {ours}", "first call",
                 *columns], rows, title=title)
    return ratios
