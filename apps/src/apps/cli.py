"""``reproduce``: run the thesis' experiments and write OUT/index.html and OUT/results.json.

    reproduce                      # every experiment, quick tier (minutes on 2 cores)
    reproduce --full               # the paper-sized tier
    reproduce --only h2mc_ring opt_nist --out outputs/report
    reproduce --list
    reproduce --executor ray [--address HOST:PORT]

Exit status: 0 when every check passed, 1 when one failed (or an experiment crashed), 2 on bad
input (unknown experiment, unwritable output folder, Ray unreachable), with a one-line error.
Nothing already in the output folder is removed; the report's own files are replaced
atomically.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import registry
from ._executor import ExecutorError, LocalExecutor, RayExecutor
from ._experiment import TIERS, Outcome


class UsageError(Exception):
    pass


def _parser():
    ap = argparse.ArgumentParser(
        prog="reproduce", description="Reproduce the thesis' experiments and write an HTML "
        "report (OUT/index.html) and OUT/results.json.")
    tier = ap.add_mutually_exclusive_group()
    tier.add_argument("--full", action="store_const", const="full", dest="tier",
                      help="paper-sized runs (long)")
    tier.add_argument("--tier", choices=TIERS, help="size tier (default quick; 'tiny' is "
                      "the integration tests' size)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these experiments")
    ap.add_argument("--list", action="store_true", help="list the experiments and exit")
    ap.add_argument("--out", default="outputs/report", help="output folder (default "
                    "outputs/report)")
    ap.add_argument("--executor", choices=("local", "ray"), default="local",
                    help="in this process (default) or as Ray tasks")
    ap.add_argument("--address", help="Ray cluster address HOST:PORT (default: start a local "
                    "Ray instance)")
    ap.add_argument("--num-cpus", type=int, help="CPUs of a local Ray instance")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap


def _select(names_wanted, known):
    if not names_wanted:
        return list(known)
    unknown = [n for n in names_wanted if n not in known]
    if unknown:
        raise UsageError(f"unknown experiment(s) {', '.join(unknown)}; `reproduce --list` "
                         "shows the names")
    return list(dict.fromkeys(names_wanted))


def _prepare_out(out: str) -> Path:
    """Create the folder if needed and prove it writable, without touching what is there."""
    p = Path(out).expanduser()
    if p.exists() and not p.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".reproduce-write-test-"):
            pass
    except OSError as err:
        raise UsageError(f"--out {out}: not writable ({err.strerror or err})") from None
    return p


def _crashed(name, err) -> Outcome:
    out = Outcome()
    out.check("experiment ran", "-", f"crashed: {type(err).__name__}: {err}", False)
    out.notes.append("".join(traceback.format_exception(err)))
    return out


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    tier = args.tier or "quick"
    try:
        exps = registry()
        if args.list:
            w = max(map(len, exps))
            for e in exps.values():
                print(f"{e.name:<{w}}  {e.reference}\n{'':<{w}}  {e.title}")
            return 0
        names = _select(args.only, exps)
        out_dir = _prepare_out(args.out)
        if args.executor == "ray":
            executor = RayExecutor(args.address, args.num_cpus)
        elif args.address:
            raise UsageError("--address needs --executor ray")
        else:
            executor = LocalExecutor()
    except (UsageError, ExecutorError) as err:
        print(f"reproduce: error: {err}", file=sys.stderr)
        return 2

    from tqdm.auto import tqdm

    from ._report import machine_info, summary_rows, write_report

    progress = not args.no_progress
    results, t_start = {}, time.perf_counter()
    bar = tqdm(total=len(names), desc=f"reproduce ({tier})", unit="exp", disable=not progress,
               position=0, dynamic_ncols=True)
    try:
        for name, outcome, secs in executor.submit_all(names, tier, progress):
            if isinstance(outcome, BaseException):  # a crash is a failed check, not an abort
                outcome = _crashed(name, outcome)
            results[name] = (outcome, secs)
            bar.set_postfix_str(f"{name}: {'ok' if outcome.passed else 'FAILED'}")
            bar.update()
    finally:
        bar.close()
        executor.shutdown()
    total = time.perf_counter() - t_start
    results = {n: results[n] for n in names if n in results}
    info = machine_info(executor.name, tier, total)
    write_report(out_dir, exps, results, info)
    rows = summary_rows(exps, results)
    _print_summary(rows, total, out_dir)
    return 0 if all(o.passed for o, _ in results.values()) else 1


def _print_summary(rows, total, out_dir):
    head = ["experiment", "paper", "ours", "verdict", "time s"]
    cut = [[r["name"], r["paper"][:44], r["ours"][:34], r["verdict"], f"{r['seconds']:.1f}"]
           for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cut)) for i, h in enumerate(head)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths))
    print("\n" + line + "\n" + "-" * len(line))
    for c in cut:
        print("  ".join(x.ljust(w) for x, w in zip(c, widths)))
    failed = [r["name"] for r in rows if r["verdict"] == "FAILED"]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} experiments reproduced in {total:.1f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else "")
          + f"\nreport: {os.path.join(out_dir, 'index.html')}")


if __name__ == "__main__":
    sys.exit(main())
