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

__all__ = ["build_in_workers", "default_workers", "serve", "WORKERS_MAX", "WORKER_MEMORY"]

WORKERS_MAX = 8
# A worker's peak memory budget: the torus' 7-segment Hessian (240k operations) peaked at
# 2.4 GB of RSS while it was derived and compiled.
WORKER_MEMORY = 3 << 30
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
    todo, built, lock = list(tasks), [], threading.Lock()
    # the workers import what this process imports (a source checkout on sys.path too)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with tempfile.TemporaryDirectory(prefix="h2mc-build-") as folder:
        path = os.path.join(folder, "recipe.pickle")
        with open(path, "wb") as f:
            pickle.dump(recipe, f)

        def serve():
            try:
                proc = subprocess.Popen([sys.executable, "-c", _WORKER, path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
            except OSError:  # no worker: the parent builds the kernels
                return
            try:
                while True:
                    with lock:
                        if not todo:
                            return
                        task = todo.pop(0)
                    proc.stdin.write(json.dumps(task) + "\n")
                    proc.stdin.flush()
                    answer = _answer(proc.stdout)
                    if answer is None:  # the worker died: the parent builds the rest
                        return
                    if answer == "ok":
                        with lock:
                            built.append(task)
                            if on_built is not None:
                                on_built(task)
            except OSError:  # a broken pipe: the worker died
                return
            finally:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
                proc.wait()

        threads = [threading.Thread(target=serve, daemon=True)
                   for _ in range(min(workers, len(todo)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return built


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

    space = PathSpace(**recipe)
    for line in sys.stdin:
        try:
            space._build_kernel(tuple(json.loads(line)))
            answer = "ok"
        except Exception as e:  # noqa: BLE001 -- the parent builds it again and raises there
            answer = f"failed {type(e).__name__}: {e}".replace("\n", " ")
        answers.write(f"{_ANSWER} {answer}\n")
        answers.flush()
