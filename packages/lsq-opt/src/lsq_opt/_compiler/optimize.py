"""Opt's optimisations of the generated routines (paper section 6, spec 5.4), as toggles.

* ``polynomial``: the products (J^T J p, J^T F, diag J^T J) are assembled as core_ad
  expressions over *location leaves* (one leaf per buffer, plane and displacement from the
  lane), so one program per kernel shares every load between lane shifts and core_ad's
  construction rules (n-ary sums, like terms and constant coefficients merged, zero partials
  dropped) simplify the product itself. Off: the partials are emitted per lane shift and the
  product is multiplied out in LLVM, term by term. (core_ad builds every expression, the
  partials included, in its simplified polynomial form; that cannot be switched off.)
* ``horner``: :func:`core_ad.sym.horner`, greedy multivariate Horner factoring of the sums.
* ``bounds``: valid masks and bounds tests are boolean factors: masks with the same content
  share one plane (one load), and ``sym.horner(conditions=True)`` hoists a condition shared by
  several terms so that it is tested once.
* ``conditional``: a ``where(c, e, 0)`` whose ``e`` needs at least ``MIN_GUARDED`` operations
  of its own is emitted as a branch: ``e`` (its loads included) runs only when ``c`` holds in
  some lane of the vector.

Opt's greedy register-minimising scheduler and its texture loads have no CPU counterpart
here: LLVM's instruction scheduler and register allocator reorder the straight-line code
whatever order it is emitted in, and CPU loads have no texture path.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields

from core_ad import codegen, sym
from llvmlite import ir

__all__ = ["Optimizations", "code_statistics"]

# a guarded expression must hold at least this many nodes (operations and loads) of its own:
# below, the branch costs more than the select of always computing it
MIN_GUARDED = 32


@dataclass(frozen=True)
class Optimizations:
    """Which of Opt's code optimisations the fused kernels apply (``Optimizations()``: all on;
    a plan's default is :meth:`for_backend`, which leaves ``conditional`` off on the CPU)."""

    polynomial: bool = True
    horner: bool = True
    bounds: bool = True
    conditional: bool = True

    def __post_init__(self):
        for f in fields(self):
            if not isinstance(getattr(self, f.name), bool):
                raise TypeError(f"Optimizations.{f.name} must be a bool, got "
                                f"{type(getattr(self, f.name)).__name__}")

    @classmethod
    def for_backend(cls, backend: str) -> Optimizations:
        """The default of ``compile_problem(backend=...)``: every optimisation, except
        ``conditional`` on the CPU (``"llvm"`` / ``"numpy"``). A paired, alternating A/B of
        applyJTJ's thread CPU time (benchmarks/RESULTS.md) found the guards a consistent loss
        on the CPU: shading 6-11 % slower in 120 of 120 rounds (a vector skips its guarded
        code only when all its lanes are false, and the branches keep LLVM from sharing
        arithmetic across them); ARAP image within noise (either sign between runs), ARAP
        mesh unaffected (no guards). On a GPU a warp skipping divergent work is Opt's
        measured gain: on for ``"cuda"``."""
        if backend not in ("llvm", "numpy", "cuda"):
            raise ValueError(f"Optimizations.for_backend: backend must be 'llvm', 'numpy' or "
                             f"'cuda', got {backend!r}")
        return cls(conditional=backend == "cuda")

    @classmethod
    def none(cls) -> Optimizations:
        return cls(polynomial=False, horner=False, bounds=False, conditional=False)

    @classmethod
    def ladder(cls) -> list:
        """``[(label, Optimizations)]``: none, then each pass added in the paper's order."""
        out, on = [("none", cls.none())], {}
        for f in fields(cls):
            on[f.name] = True
            out.append(("+" + f.name, cls(**{**cls.none().__dict__, **on})))
        return out

    def factor(self, roots):
        """The Horner / condition factoring these options ask for, on a list of roots."""
        if not (self.horner or self.bounds):
            return list(roots)
        return sym.horner(list(roots), numeric=self.horner, conditions=self.bounds)


def _is_guard(n) -> bool:
    return (isinstance(n, sym.Apply) and n.prim.name == "select" and n.dtype.kind == "f"
            and sym.is_const(n.args[2], 0) and not isinstance(n.args[1], sym.Const))


def _regions(nodes, roots, guards):
    """Innermost guard region (a guard's id, or None: unconditional) in which every node can
    be computed: the common ancestor of the regions of its users."""
    users: dict = {}
    for n in nodes:
        if isinstance(n, sym.Apply):
            for a in n.args:
                users.setdefault(id(a), []).append(n)
    root_ids = {id(r) for r in roots}
    parent, depth, region = {None: None}, {None: 0}, {}

    def lca(a, b):
        while a != b:
            if depth[a] >= depth[b]:
                a = parent[a]
            else:
                b = parent[b]
        return a

    for n in reversed(nodes):
        r = False
        if id(n) in root_ids:
            r = None
        for u in users.get(id(n), ()):
            ru = id(u) if (id(u) in guards and u.args[1] is n and u.args[0] is not n) else region[id(u)]
            r = ru if r is False else lca(r, ru)
        region[id(n)] = None if r is False else r
        if id(n) in guards:
            parent[id(n)] = region[id(n)]
            depth[id(n)] = depth[region[id(n)]] + 1
    return region, parent


def emit_guarded(em, b, roots, env, load_leaf=None, conditional=True):
    """Emit ``roots`` (core_ad expressions) with ``em`` (a ``codegen.Emitter`` on builder
    ``b``); returns one value per root. Leaves come from ``env`` or, where missing, from
    ``load_leaf(leaf)``, called in the block that first needs the leaf (inside a guard when
    only guarded code reads it). ``conditional``: guards become branches (module doc)."""
    nodes = sym.toposort(roots)
    guards = {id(n) for n in nodes if _is_guard(n)} if conditional else set()
    region, parent = _regions(nodes, roots, guards)
    if guards:  # drop guards too small to pay for a branch, then place the nodes again
        own: dict = {}
        for n in nodes:
            if not isinstance(n, sym.Const):
                r = region[id(n)]
                while r is not None:
                    own[r] = own.get(r, 0) + 1
                    r = parent[r]
        guards = {g for g in guards if own.get(g, 0) >= MIN_GUARDED}
        region, parent = _regions(nodes, roots, guards)
    if not guards:  # straight-line code: core_ad's program emitter (it reuses n-ary sub-sums)
        env = dict(env)
        for n in nodes:
            if isinstance(n, sym.Leaf) and n not in env:
                env[n] = load_leaf(n)
        return em.emit_program(sym.cse(roots), env)
    members: dict = {}
    for n in nodes:
        members.setdefault(region[id(n)], []).append(n)
    values: dict = {}  # id(node) -> value, for the nodes that dominate the current block
    env = dict(env)

    def emit_node(n):
        if isinstance(n, sym.Leaf):
            v = env[n] if n in env else load_leaf(n)
            values[id(n)] = v if isinstance(v, codegen.BufferArg) else em.splat(v)
        elif isinstance(n, sym.Const):
            values[id(n)] = em.const(n.value, n.dtype)
        else:
            values[id(n)] = em.apply(n, [values[id(a)] for a in n.args])

    def emit_region(r, depth):
        for n in members.get(r, ()):
            if id(n) not in guards:
                emit_node(n)
                continue
            c = values[id(n.args[0])]
            anyc = c
            if isinstance(c.type, ir.VectorType):
                anyc = b.icmp_unsigned("!=", b.bitcast(c, ir.IntType(c.type.count)),
                                       ir.Constant(ir.IntType(c.type.count), 0))
            entry = b.block
            # block names carry the nesting depth: code_statistics counts guarded loads by them
            body = b.append_basic_block(f"guard_d{depth + 1}")
            done = b.append_basic_block(f"guard_d{depth}_end")
            b.cbranch(anyc, body, done)
            b.position_at_end(body)
            saved = dict(values)
            emit_region(id(n), depth + 1)
            x = values[id(n.args[1])]
            val = b.select(c, x, ir.Constant(x.type, None)) if isinstance(c.type, ir.VectorType) else x
            last = b.block
            b.branch(done)
            values.clear()
            values.update(saved)  # what the guarded block computed does not dominate the rest
            b.position_at_end(done)
            phi = b.phi(x.type)
            phi.add_incoming(val, last)
            phi.add_incoming(ir.Constant(x.type, None), entry)
            values[id(n)] = phi

    emit_region(None, 0)
    return [values[id(r)] for r in roots]


_ARITH = re.compile(r"= (fadd|fsub|fmul|fdiv|fneg|frem) ")
_CALL = re.compile(r"= (tail )?call ")
_LOAD = re.compile(r"= load ")
_SELECT = re.compile(r"= select ")
_GUARD = re.compile(r"guard_d(\d+)(_end)?")
_FN = re.compile(r'define [^@]*@"?([\w.]+)"?\(.*?\n}\n', re.S)


def _llvm_optimised(ir_text: str) -> str:
    """``ir_text`` after LLVM's O3 IR pipeline for the host (as core_ad's JIT runs it)."""
    import llvmlite.binding as llvm  # noqa: PLC0415

    tm = codegen.target_machine()
    mod = llvm.parse_assembly(ir_text)
    mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = False
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return str(mod)


def code_statistics(plan, optimized: bool = False) -> dict:
    """Static counts in the fused kernels' LLVM IR as generated or, with ``optimized=True``,
    after LLVM's O3 IR pipeline (its GVN / instcombine already merge repeated loads and equal
    arithmetic, so that is what the CPU runs):
    ``{kernel: {"arith", "calls", "loads", "selects", "guards", "guarded_loads"}}`` with
    kernel names like ``grid0_jtjp`` / ``graph_0_grad``; ``arith``: float add / sub / mul /
    div / neg, ``calls``: math-library calls, ``guards``: branches of conditional execution,
    ``guarded_loads``: loads that only run when their guard holds (both as generated)."""
    def functions(text):
        return {re.sub(r"_[0-9a-f]{16,}$", "", m.group(1)): m.group(0) for m in _FN.finditer(text)}

    out = {}
    bodies = functions(_llvm_optimised(plan.fused.ir) if optimized else plan.fused.ir)
    for name, body in functions(plan.fused.ir).items():
        guarded = guards = 0  # by the block names of the IR as generated
        for blk in re.split(r"\n(?=[\w.\"]+:)", body):
            g = _GUARD.match(blk.lstrip('"'))
            if g and int(g.group(1)) > 0:
                guarded += len(_LOAD.findall(blk))
                guards += g.group(2) is None
        b = bodies[name]
        out[name] = {"arith": len(_ARITH.findall(b)), "calls": len(_CALL.findall(b)),
                     "loads": len(_LOAD.findall(b)), "selects": len(_SELECT.findall(b)),
                     "guards": guards, "guarded_loads": guarded}
    return out
