"""Where experiments and their independent pieces run: in this process, or as Ray tasks.

An experiment's ``run(ctx, **size)`` hands its independent pieces (chain batches, benchmark
cases, per-problem solves) to ``ctx.map(fn, items)``. Every piece draws its randomness from
its own arguments (seeds), never from shared state, so the results are identical whichever
executor ran them.
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Iterable


class ExecutorError(RuntimeError):
    """The executor could not be set up (Ray missing, address not answering)."""


class Context:
    """What ``run`` receives: ``map`` for independent pieces, ``progress`` for a bar."""

    def __init__(self, name: str = "", progress: bool = False):
        self.name = name
        self.show_progress = progress

    def progress(self, iterable, total=None, desc=None):
        if not self.show_progress:
            return iterable
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=f"  {self.name}: {desc or ''}".rstrip(": "),
                    leave=False, position=1, dynamic_ncols=True)

    def map(self, fn: Callable, items: Iterable, desc: str | None = None) -> list:
        """``[fn(item) for item in items]``, the items independent of each other."""
        return self.starmap(fn, [(it,) for it in items], desc)

    def starmap(self, fn: Callable, arg_tuples: Iterable, desc: str | None = None) -> list:
        """``[fn(*args) for args in arg_tuples]``, the calls independent of each other."""
        arg_tuples = list(arg_tuples)
        return [fn(*a) for a in self.progress(arg_tuples, total=len(arg_tuples), desc=desc)]


class RayContext(Context):
    """``map`` submits one Ray task per piece (nested inside the experiment's own task)."""

    def starmap(self, fn, arg_tuples, desc=None):
        import ray

        remote = ray.remote(_call)
        return ray.get([remote.remote(fn, *a) for a in arg_tuples])


def _call(fn, *args):
    return fn(*args)


def _run_experiment(exp_name: str, tier: str, ray_pieces: bool, progress: bool):
    """Run one experiment by name (importable in a Ray worker) -> (Outcome, seconds)."""
    import time

    from . import registry

    exp = registry()[exp_name]
    ctx = (RayContext if ray_pieces else Context)(exp_name, progress)
    t0 = time.perf_counter()
    outcome = exp.run(ctx, **exp.sizes[tier])
    return outcome, time.perf_counter() - t0


def check_address(address: str, timeout: float = 3.0) -> None:
    """Fail fast (one line) when a Ray head at ``host:port`` does not answer."""
    addr = address.split("://", 1)[-1]
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ExecutorError(f"--address {address!r}: expected HOST:PORT (e.g. 10.0.0.5:6379)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ExecutorError(f"Ray head at {address} does not answer ({err.strerror or err})")


class LocalExecutor:
    name = "local"

    def submit_all(self, names, tier, progress):
        """Yield (name, outcome or the exception it raised, seconds) as each one finishes."""
        import time

        for n in names:
            t0 = time.perf_counter()
            try:
                out, secs = _run_experiment(n, tier, False, progress)
            except Exception as err:  # noqa: BLE001 (reported as that experiment's failure)
                out, secs = err, time.perf_counter() - t0
            yield n, out, secs

    def shutdown(self):
        pass


class RayExecutor:
    """Each experiment is a Ray task; its pieces are nested tasks. ``address=None`` starts a
    local Ray instance (``num_cpus`` workers); otherwise connects to a running cluster."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        try:
            import ray
        except ImportError as err:
            raise ExecutorError("--executor ray needs Ray: pip install 'difvis-apps[ray]'"
                                ) from err
        if address and address != "auto":
            check_address(address)
        kw: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": False,
                              "include_dashboard": False}
        if address:
            kw["address"] = address
        elif num_cpus:
            kw["num_cpus"] = num_cpus
        try:
            ray.init(**kw)
        except Exception as err:  # noqa: BLE001 (Ray raises several types; one line for all)
            raise ExecutorError(f"could not start or reach Ray ({type(err).__name__}: "
                                f"{str(err).splitlines()[0] if str(err) else ''})") from err
        self._ray = ray

    def submit_all(self, names, tier, progress):
        ray = self._ray
        remote = ray.remote(_run_experiment)
        refs = {remote.remote(n, tier, True, False): n for n in names}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                out, secs = ray.get(done[0])
            except Exception as err:  # noqa: BLE001 (reported as that experiment's failure)
                out, secs = err, float("nan")
            yield refs[done[0]], out, secs

    def shutdown(self):
        self._ray.shutdown()
