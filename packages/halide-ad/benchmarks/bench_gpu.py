"""halide_ad on a CUDA GPU (spec AE-10 and AE-14), next to PyTorch on the same GPU in one run.

1. **AE-10, scatter-to-gather versus atomics** (paper §4.2.1: "the backward pass of a 2D
   convolution layer applied to a 16 x 16 x 256 x 256 input takes 68 ms using atomics and 6 ms
   with our scatter-to-gather conversion"): the ``conv_layer`` app (3 x 3, 16 -> 16 channels,
   float32). The input gradient (a) from ``propagate_adjoints`` (a gather) and (b) with
   ``scatter_to_gather=False`` (a general scatter, auto-scheduled with atomics); then the
   whole backward (input and weight gradients, gathers) next to PyTorch's ``conv2d`` backward
   (cuDNN, TF32 off so both compute in float32).
2. **AE-14, the high-resolution bilateral slice** (paper §5.1.3: 2048 x 2048, grid 64 x 64 x 8,
   batch 4; 165 ms, 13.7x the authors' CUDA): forward and the gradients of grid, guide and
   image (cotangent: ones), next to PyTorch's gather version (the paper's) and its
   ``grid_sample`` version, with the device memory each used.

Every pipeline is ``auto_schedule(target="gpu")``d. Two times for ours: ``realize`` (what a
caller of ``Pipeline.realize`` on numpy arrays sees: the inputs copied to the device, the
kernels, the results copied back) and ``kernels`` (CUDA events around each launch, summed:
the time comparable to PyTorch's, whose tensors stay on the device); for AE-14 also the
pipeline on CuPy arrays (Buffers on the device, no transfers). Gradients are checked
to agree (normwise, 1e-4) before timing. Medians of ``--repeats`` alternated runs; first calls
(NVRTC compilation) reported apart. Without CuPy or a device the script says so and exits 0.

    PYTHONPATH=packages/core-ad/src:packages/halide-ad/src \\
        python packages/halide-ad/benchmarks/bench_gpu.py [--scale 1] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np
from core_ad import benchmark as bench
from core_ad import codegen

import halide_ad as hl
from halide_ad import _pipeline
from halide_ad.apps import bilateral_slice, conv_layer

PAPER_AE10 = "paper: 6 ms (gather) / 68 ms (atomics), about 11x; target (a) >= 3x faster"
PAPER_AE14 = "paper: 165 ms on a Titan-class GPU (13.7x the authors' CUDA, 2270 ms)"


class KernelClock:
    """Sums the device time of every halide_ad kernel launch (a CUDA event pair each); the
    last call's time per kernel (named by the definition it computes) in ``last``."""

    def __init__(self, cp):
        self.cp, self.events, self.last = cp, [], {}
        get = codegen.cuda_kernel

        def timed_kernel(source, name):
            kernel = get(source, name)
            head = source[source.rindex("// ", 0, source.index("void __launch_bounds__")):]
            label = head.split("\n", 1)[0][3:]

            def launch(grid, block, args):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                kernel(grid, block, args)
                end.record()
                self.events.append((label, start, end))
            return launch
        _pipeline.codegen = _ClockedCodegen(timed_kernel)

    def take(self) -> float:
        self.cp.cuda.Device().synchronize()
        times = [(label, self.cp.cuda.get_elapsed_time(s, e) / 1e3)
                 for label, s, e in self.events]
        self.last = {}
        for label, t in times:
            self.last[label] = self.last.get(label, 0.0) + t
        self.events = []
        return sum(t for _, t in times)


class _ClockedCodegen:
    """``core_ad.codegen`` as ``_pipeline`` sees it, with the kernel getter timed."""

    def __init__(self, cuda_kernel):
        self.cuda_kernel = cuda_kernel

    def __getattr__(self, name):
        return getattr(codegen, name)


def gpu_pipeline(funcs, arrays):
    hl.auto_schedule(funcs, {f: list(reversed(a.shape)) for f, a in zip(funcs, arrays)},
                     target="gpu")
    p = hl.Pipeline(funcs)
    bufs = [hl.Buffer(a) for a in arrays]
    return lambda: p.realize(bufs)


def ours(cases, kernel_times, clock, name, realize, arrays, first):
    first[name], _ = bench.time_first_call(realize)
    clock.take()

    def run():
        realize()
        kernel_times.setdefault(name, []).append(clock.take())
        run.breakdown = clock.last
        return arrays
    cases[name] = run


def conv_cases(torch, cp, clock, scale, first, kernel_times, notes):
    rng = np.random.default_rng(0)
    n, c, size = 16, 16, 256 // scale
    inp = rng.standard_normal((n, c, size, size)).astype(np.float32)
    w = (rng.standard_normal((c, c, 3, 3)) / 12).astype(np.float32)
    dout = rng.standard_normal((n, c, size - 2, size - 2)).astype(np.float32)
    cases, results = {}, {}
    for label, gather, wrt in (("(a) d_input, gather", True, ("input",)),
                               ("(b) d_input, atomics", False, ("input",)),
                               ("halide_ad backward", True, ("input", "weights"))):
        app = conv_layer.build(hl, inp, w)
        d = hl.propagate_adjoints(app.output, dout, scatter_to_gather=gather)
        funcs = [d[app.buffers[k]] for k in wrt]
        arrays = [np.empty_like(app.buffers[k].numpy()) for k in wrt]
        ours(cases, kernel_times, clock, label, gpu_pipeline(funcs, arrays), arrays, first)
        results[label] = cases[label]
    torch.backends.cudnn.allow_tf32 = False
    t_inp, t_w, t_dout = (torch.from_numpy(a).cuda() for a in (inp, w, dout))

    def torch_backward():  # the gradients stay on the device, as ours do in "kernels"
        i, k = t_inp.clone().requires_grad_(True), t_w.clone().requires_grad_(True)
        torch.nn.functional.conv2d(i, k).backward(t_dout)
        torch.cuda.synchronize()
        return [i.grad, k.grad]
    first["torch cuda backward"], want = bench.time_first_call(torch_backward)
    want = [g.cpu().numpy() for g in want]
    cases["torch cuda backward"] = torch_backward
    got = {label: run() for label, run in results.items()}
    for k in kernel_times:
        kernel_times[k].clear()
    diffs = {"(a) vs torch": bench.max_rel_diff(got["(a) d_input, gather"][0], want[0]),
             "(b) vs torch": bench.max_rel_diff(got["(b) d_input, atomics"][0], want[0]),
             "d_weights vs torch": bench.max_rel_diff(got["halide_ad backward"][1], want[1])}
    bench.report_agreement("conv layer gradients", diffs, 1e-4)
    return cases


def slice_cases(torch, cp, clock, scale, first, kernel_times, notes):
    torch.manual_seed(2)
    size, gs = 2048 // scale, 64 // scale
    grid = torch.rand(4, 12, 8, gs, gs)
    guide, image = torch.rand(4, size, size), torch.randn(4, 3, size, size)
    arrays_in = [a.numpy() for a in (grid, guide, image)]
    app = bilateral_slice.build(hl, *arrays_in)
    ones = np.ones(list(reversed(app.sizes["output"])), np.float32)
    d = hl.propagate_adjoints(app.output, ones)
    funcs = [app.output] + [d[app.buffers[k]] for k in ("grid", "guide", "image")]
    arrays = [np.empty_like(ones)] + [np.empty_like(a) for a in arrays_in]
    cases = {}
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    ours(cases, kernel_times, clock, "halide_ad", gpu_pipeline(funcs, arrays), arrays, first)
    memory = {"halide_ad": f"{pool.total_bytes() / 2**30:.2f} GiB (CuPy pool)"}
    # the same with CuPy arrays in and out (Buffers on the device: no transfers)
    dev_in = [cp.asarray(a) for a in arrays_in]
    app_d = bilateral_slice.build(hl, *dev_in)
    d_d = hl.propagate_adjoints(app_d.output, hl.Buffer(cp.ones(ones.shape, ones.dtype)))
    funcs_d = [app_d.output] + [d_d[app_d.buffers[k]] for k in ("grid", "guide", "image")]
    dev_out = [cp.empty(a.shape, a.dtype) for a in [ones] + arrays_in]
    hl.auto_schedule(funcs_d, {f: list(reversed(a.shape)) for f, a in zip(funcs_d, dev_out)},
                     target="gpu")
    p_d, bufs_d = hl.Pipeline(funcs_d), [hl.Buffer(a) for a in dev_out]

    def realize_on_device():
        p_d.realize(bufs_d)
        cp.cuda.Device().synchronize()
    ours(cases, kernel_times, clock, "halide_ad, device arrays", realize_on_device, dev_out,
         first)
    tensors = [t.cuda() for t in (grid, guide, image)]

    def make(fn):
        def run():
            leaves = [t.clone().requires_grad_(True) for t in tensors]
            out = fn(torch, *leaves)
            out.sum().backward()
            torch.cuda.synchronize()
            return [out.detach()] + [leaf.grad for leaf in leaves]
        return run
    for name, fn in (("torch cuda gather", bilateral_slice.torch_reference),
                     ("torch cuda grid_sample", bilateral_slice.torch_grid_sample)):
        torch.cuda.reset_peak_memory_stats()
        try:
            first[name], want = bench.time_first_call(make(fn))
            want = [t.cpu().numpy() for t in want]
        except torch.cuda.OutOfMemoryError as err:
            notes.append(f"{name}: out of memory ({bench.error_reason(err, 120)})")
            continue
        memory[name] = f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (peak)"
        cases[name] = make(fn)
        got = cases["halide_ad"]()
        kernel_times["halide_ad"].clear()
        on_device = [cp.asnumpy(a) for a in cases["halide_ad, device arrays"]()]
        kernel_times["halide_ad, device arrays"].clear()
        bench.report_agreement("device arrays vs numpy arrays", {
            k: bench.max_rel_diff(a, b) for k, a, b in zip(("output", "d_grid", "d_guide", "d_image"),
                                                          on_device, got)}, 1e-6)
        # grid_sample's border padding clamps z to the outer cell centres, so its d_guide is
        # 0 within half a cell of 0 and 1, where the gather version (and ours) interpolate
        # the repeated edge with a nonzero slope: d_guide is compared with the gather only
        names = ("output", "d_grid", "d_guide", "d_image")
        bench.report_agreement(f"bilateral slice vs {name}",
                               {k: bench.max_rel_diff(a, b) for k, a, b in zip(names, got, want)
                                if not (k == "d_guide" and "grid_sample" in name)}, 1e-4)
    return cases, memory


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=1, help="divide every size by this")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if not codegen.cuda_available():
        print("bench_gpu: no CuPy with a CUDA device here; nothing to time")
        return 0
    import cupy as cp
    import torch
    print(f"bench_gpu: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()},"
          f" CuPy {cp.__version__}, torch {torch.__version__}")
    print(bench.machine_info())
    clock = KernelClock(cp)
    notes: list[str] = []
    for title, make, paper in (("AE-10 conv layer backward, 16 x 16 x 256 x 256 float32",
                                conv_cases, PAPER_AE10),
                               ("AE-14 bilateral slice 2048^2, grid 64 x 64 x 8, batch 4,"
                                " forward + backward", slice_cases, PAPER_AE14)):
        first, kernel_times = {}, {}
        made = make(torch, cp, clock, args.scale, first, kernel_times, notes)
        cases, memory = made if isinstance(made, tuple) else (made, {})
        res = bench.compare_and_report(cases, args.repeats, first_calls=first)
        rows = dict(res)
        for name, times in kernel_times.items():
            rows[f"{name} (kernels)"] = bench.summarize(times)
        ours_name = f"{next(iter(kernel_times))} (kernels)"
        bench.side_by_side(rows, ours_name, title=f"{title} (scale 1/{args.scale})",
                           first_calls=first, columns={"device memory": memory})
        print(paper)
        for name in kernel_times:
            parts = sorted(cases[name].breakdown.items(), key=lambda kv: -kv[1])
            print(f"{name}, last run per kernel: " + ", ".join(
                f"{label} {bench.fmt_time(t)}" for label, t in parts))
        if "(b) d_input, atomics (kernels)" in rows:
            a = rows["(a) d_input, gather (kernels)"]["median"]
            b = rows["(b) d_input, atomics (kernels)"]["median"]
            print(f"AE-10: atomics / gather = {b / a:.1f}x (kernels only)")
    for note in notes:
        print("note:", note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
