"""Diagnostics: ``whos()`` lists what the graph and the lazy scope hold, with sizes;
``graphviz()`` writes structurally valid DOT for eager and lazy graphs."""

import gc
import re

import numpy as np

import core_ad as ad
import core_ad.numpy as anp


def _rows(rep, name):
    return [r for r in rep.rows if r["name"] == name]


def test_whos_lists_live_pending_and_evaluated_arrays_with_sizes():
    x = ad.Array(np.linspace(0.0, 1.0, 1000), requires_grad=True, name="wx")
    with ad.lazy():
        y = ad.label(anp.sin(x) * x, "wy")
        z = ad.label(anp.exp(y).astype("float32"), "wz")
        rep = ad.whos(file=False)
        assert isinstance(rep, str) and "wy" in rep and "wz" in rep
        (rx,), (ry,), (rz,) = _rows(rep, "wx"), _rows(rep, "wy"), _rows(rep, "wz")
        assert rx == {"name": "wx", "kind": "leaf", "shape": (1000,), "dtype": "float64",
                      "state": "evaluated", "bytes": 8000}
        assert (ry["kind"], ry["state"], ry["bytes"]) == ("mul", "pending", 8000)
        assert (rz["dtype"], rz["state"], rz["bytes"]) == ("float32", "pending", 4000)
        assert rep.pending_bytes >= 8000 + 8000 + 4000  # sin, mul, astype at least
        assert rep.n_ops >= 3
        ad.eval(z)
        rep2 = ad.whos(file=False)
        assert [(r["state"], r["bytes"]) for r in _rows(rep2, "wy") + _rows(rep2, "wz")] == [
            ("evaluated", 8000), ("evaluated", 4000)]
        assert rep2.pending_bytes == 0 and rep2.n_ops == 0
        # what y's graph holds: sin(x) was folded into y's edge weight by vertex elimination
        only = ad.whos(y, file=False)
        assert [(r["name"], r["kind"]) for r in only.rows] == [
            ("wy", "linear"), ("wx", "leaf"), ("", "weight")]
        assert only.n_nodes == 1 and only.evaluated_bytes == 3 * 8000
    del y, z
    gc.collect()
    rep3 = ad.whos(file=False)
    assert not _rows(rep3, "wy") and not _rows(rep3, "wz")  # nothing holds them any more


def test_whos_prints_the_table(capsys):
    x = ad.Array(np.ones(7), requires_grad=True, name="printed")
    y = x * 2.0
    rep = ad.whos()
    out = capsys.readouterr().out
    assert out.strip() == rep.strip()
    assert re.search(r"printed\s+leaf\s+\(7,\)\s+float64\s+evaluated\s+56", out)
    assert "graph nodes" in out.splitlines()[-1]
    del y


def _check_dot(src):
    assert src.startswith("digraph") and src.count("{") == src.count("}")
    declared = set(re.findall(r"^\s*(\w+) \[label=", src, re.M))
    edges = re.findall(r"^\s*(\w+) -> (\w+);", src, re.M)
    assert edges
    for s, t in edges:
        assert s in declared and t in declared
    return declared, edges


def test_graphviz_eager_graph(tmp_path):
    x = ad.Array(np.arange(4.0), requires_grad=True, name="gx")
    idx = np.array([0, 2])
    with ad.lazy(False):  # every node recorded (lazy mode would fold exp and mul into take)
        out = anp.sum(anp.take(anp.exp(x) * x, idx))
    path = tmp_path / "g.dot"
    src = ad.graphviz(out, path)
    assert path.read_text() == src
    declared, edges = _check_dot(src)
    for prim in ("exp", "mul", "take", "reduce_sum", "leaf 'gx'"):
        assert prim in src
    assert "pending" not in src
    assert len(declared) == 5  # x, exp, mul, take (the index is a parameter), sum
    assert len(edges) == 5  # x->exp, x->mul, exp->mul, mul->take, take->sum


def test_graphviz_lazy_graph_marks_pending_nodes():
    x = ad.Array(np.arange(4.0), requires_grad=True)
    with ad.lazy():
        y = anp.cos(x) + x
        src = ad.graphviz(y)
        _check_dot(src)
        assert src.count("pending") == 2 and "cos" in src and "add" in src
        # untracked lazy arithmetic: the expression it will compute is shown
        u = anp.sqrt(ad.Array(np.ones(3)) * 2.0)
        src_u = ad.graphviz(u)
        _check_dot(src_u)
        assert "sqrt" in src_u and "mul" in src_u and "buffer" in src_u
        ad.eval(y)
        src = ad.graphviz(y)
        _check_dot(src)
        # evaluated, and cos was folded into y's edge weight by vertex elimination
        assert "pending" not in src and "linear" in src and "cos" not in src
