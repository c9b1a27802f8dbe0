"""Kernels built in other processes, side by side: :meth:`PathSpace.compile_kernels`' workers.

A long path's Hessian kernel takes minutes to derive and compile, and a render's kernels were
built one after the other in its process: on an empty cache the torus' (paths of up to 7
segments, modified coordinates, lens kernels) took ~27 min of CPU, the largest Hessian
~2 min and 2.4 GB. Where two or more derivative kernels are missing from core_ad's disk cache,
``compile_kernels`` starts worker processes (:func:`build_in_workers`): each is a fresh
interpreter (:func:`serve`) that rebuilds the path space from its
pickled constructor arguments and builds the kernels it is sent, one JSON task per line on
stdin, into the disk cache (every process shares it); the parent then loads them from there.
Tasks go out longest first, each to the next idle worker. A task that fails in a worker, or a
worker that dies, only costs time: the parent builds what the workers did not, and raises
there if it fails again.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading

__all__ = ["build_in_workers", "default_workers", "retire_rss", "serve", "WORKERS_MAX",
           "WORKER_MEMORY", "RETIRE_MB"]

WORKERS_MAX = 8
# A worker's peak memory budget: the torus' 7-segment Hessian (240k operations) peaked at
# 2.4 GB of RSS while it was derived and compiled, and a worker keeps what it built (core_ad's
# caches, the LLVM modules): one that built half of the torus' kernels reached 4.1 GB. So a
# worker over retire_rss() after a task exits, and a fresh one (~3 s to start) takes the next.
WORKER_MEMORY = 4 << 30
RETIRE_MB = 1536
_RETIRING = "retiring"
_ANSWER = "h2mc-kernel-build:"  # prefixes a worker's answers (its other output goes to stderr)
_WORKER = "import sys; from h2mc._kernel_build import serve; serve(sys.argv[1])"


def default_workers() -> int:
    """One worker per core this process may run on, at most :data:`WORKERS_MAX` and as many
    as the available memory holds at :data:`WORKER_MEMORY` each."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    n = min(cores, WORKERS_MAX)
    available = _available_memory()
    return max(1, n if available is None else min(n, available // WORKER_MEMORY))


def retire_rss() -> int:
    """The resident memory in bytes above which a worker retires after a task:
    ``H2MC_KERNEL_WORKER_RETIRE_MB`` megabytes (0: after every task), else :data:`RETIRE_MB`."""
    raw = os.environ.get("H2MC_KERNEL_WORKER_RETIRE_MB", str(RETIRE_MB))
    try:
        mb = int(raw)
    except ValueError:
        mb = -1
    if mb < 0:
        raise ValueError(f"H2MC_KERNEL_WORKER_RETIRE_MB must be a whole number of megabytes >= 0,"
                         f" got {raw!r}")
    return mb << 20


def _available_memory():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return None


def build_in_workers(recipe: dict, tasks: list, workers: int, on_built=None) -> list:
    """Build ``tasks`` (tuples for ``PathSpace._build_kernel``, in the order given) in
    ``workers`` processes, each a ``PathSpace(**recipe)``; ``on_built(task)`` after each one
    a worker built. Returns the tasks built."""
    retire_rss()  # a bad setting is an error here, not a worker that dies
    todo, built, lock = list(tasks), [], threading.Lock()
    # the workers import what this process imports (a source checkout on sys.path too)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with tempfile.TemporaryDirectory(prefix="h2mc-build-") as folder:
        path = os.path.join(folder, "recipe.pickle")
        with open(path, "wb") as f:
            pickle.dump(recipe, f)

        def start():
            try:
                return subprocess.Popen([sys.executable, "-c", _WORKER, path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
            except OSError:  # no worker: the parent builds the kernels
                return None

        def serve():
            proc = None
            try:
                while True:
                    with lock:
                        if not todo:
                            return
                        task = todo.pop(0)
                    proc = proc or start()
                    if proc is None:
                        return
                    proc.stdin.write(json.dumps(task) + "\n")
                    proc.stdin.flush()
                    answer = _answer(proc.stdout)
                    if answer is None:  # the worker died: the parent builds the rest
                        return
                    if answer.startswith("ok"):
                        with lock:
                            built.append(task)
                            if on_built is not None:
                                on_built(task)
                    if answer.endswith(_RETIRING):  # a fresh worker takes the next task
                        _close(proc)
                        proc = None
            except OSError:  # a broken pipe: the worker died
                return
            finally:
                if proc is not None:
                    _close(proc)

        threads = [threading.Thread(target=serve, daemon=True)
                   for _ in range(min(workers, len(todo)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return built


def _close(proc):
    try:
        proc.stdin.close()
    except OSError:
        pass
    proc.wait()


def _rss():
    """This process' resident memory in bytes (None where /proc does not say)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _answer(stream):
    """The worker's next answer ("ok" or "failed ..."); None at the end of its output."""
    for line in stream:
        if line.startswith(_ANSWER):
            return line[len(_ANSWER):].strip()
    return None


def serve(recipe_path: str) -> None:
    """A worker: builds the tasks read from stdin (see the module docstring)."""
    answers, sys.stdout = sys.stdout, sys.stderr  # stdout carries the answers only
    with open(recipe_path, "rb") as f:
        recipe = pickle.load(f)
    from ._pathspace import PathSpace

    space, limit = PathSpace(**recipe), retire_rss()
    for line in sys.stdin:
        try:
            space._build_kernel(tuple(json.loads(line)))
            answer = "ok"
        except Exception as e:  # noqa: BLE001 -- the parent builds it again and raises there
            answer = f"failed {type(e).__name__}: {e}".replace("\n", " ")
        rss = _rss()
        retire = rss is not None and rss >= limit
        answers.write(f"{_ANSWER} {answer}{' ' + _RETIRING if retire else ''}\n")
        answers.flush()
        if retire:
            return
