"""``python -m h2mc.render`` / ``h2mc-render``: tiny renders and bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import edge_rt
from h2mc import read_png_size, render_mlt
from h2mc import render as render_module
from h2mc._mlt import AUTO_SIGMA2
from h2mc.render import main


def _run(capsys, *argv):
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("method", ["pssmlt", "mmlt", "h2mc"])
def test_tiny_render_writes_exr_and_png_and_prints_numbers(tmp_path, capsys, method):
    rc, out, _ = _run(capsys, "cornell_box", "--method", method, "--size", 16, 12,
                      "--mutations", 4, "--chains", 64, "--direct-spp", 2, "--out", tmp_path)
    assert rc == 0
    exr, png = tmp_path / f"cornell_box_{method}.exr", tmp_path / f"cornell_box_{method}.png"
    image = edge_rt.read_exr(exr)
    assert image.shape == (12, 16, 3) and np.isfinite(image).all() and image.mean() > 0
    assert read_png_size(png) == (16, 12)
    small, large = {"pssmlt": ("kelemen", "uniform"), "mmlt": ("kelemen", "mmlt"),
                    "h2mc": ("h2mc", "resample")}[method]
    for label in (f"large ({large})", small):
        assert f"acceptance {label}: " in out
    assert "mutations per second: " in out
    assert "mutations per pixel: 4.00" in out  # 4 x 192 pixels = 12 steps x 64 chains


@pytest.mark.parametrize("bidirectional", [False, True])
def test_rough_glass_scene_renders(tmp_path, capsys, bidirectional):
    """torus_glass_cube (rough dielectric cube) through the CLI: paths refract through the
    glass, light subpaths too with --bidirectional (MMLT here: its value kernels build in
    seconds)."""
    rc, out, _ = _run(capsys, "torus_glass_cube", "--method", "mmlt", "--size", 12, 12,
                      "--max-length", 4, "--mutations", 4, "--chains", 64, "--direct-spp", 1,
                      "--out", tmp_path, *(["--bidirectional"] if bidirectional else []))
    assert rc == 0 and "paths of 3..4 segments" in out
    image = edge_rt.read_exr(tmp_path / "torus_glass_cube_mmlt.exr")
    assert image.shape == (12, 12, 3) and np.isfinite(image).all() and image.mean() > 0


def test_time_budget_runs_the_chains_until_it_is_spent(tmp_path, capsys):
    rc, out, _ = _run(capsys, "cornell_box", "--method", "pssmlt", "--size", 16, 12,
                      "--time", 1.5, "--chains", 64, "--direct-spp", 1, "--out", tmp_path)
    assert rc == 0
    mpp = float(out.split("mutations per pixel: ")[1].split()[0])
    assert mpp > 4
    assert np.isfinite(edge_rt.read_exr(tmp_path / "cornell_box_pssmlt.exr")).all()


def test_renders_of_one_scene_can_share_its_compiled_path_space(monkeypatch):
    """An equal-time comparison renders one scene per seed and method: with
    ``path_space=path_space_for(...)`` the PathSpace (its compiled kernels) is built once, and
    the images still depend on the seed."""
    from edge_rt import scenes
    built = []
    real = render_module.PathSpace
    monkeypatch.setattr(render_module, "PathSpace",
                        lambda *a, **kw: built.append(1) or real(*a, **kw))
    scene = scenes.cornell_box()
    scene.camera.resolution = (8, 6)
    ps = render_module.path_space_for(scene)
    kw = dict(mutations_per_pixel=1, chains=16, direct_spp=1, path_space=ps)
    a = render_module.render(scene, "pssmlt", seed=0, **kw)[0]
    b = render_module.render(scene, "mmlt", seed=1, **kw)[0]
    c = render_module.render(scene, "pssmlt", seed=1, **kw)[0]
    assert len(built) == 1
    assert not np.array_equal(a, c) and np.isfinite(b).all()


def test_render_passes_the_lens_step_size_in_the_modified_coordinates(monkeypatch):
    """``render(..., lens_sigma2=...)`` reaches render_mlt in the modified coordinates (the
    lens perturbation's prior variance; the equal-time harness' ``--lens-sigma``)."""
    from edge_rt import scenes
    seen = []
    monkeypatch.setattr(render_module, "render_mlt",
                        lambda *a, **kw: seen.append(kw.get("lens_sigma2")) or render_mlt(*a, **kw))
    scene = scenes.cornell_box()
    scene.camera.resolution = (8, 6)
    kw = dict(mutations_per_pixel=1, chains=16, direct_spp=0)
    render_module.render(scene, "mmlt", parameterization="modified", lens_sigma2=9e-4, **kw)
    render_module.render(scene, "mmlt", lens_sigma2=9e-4, **kw)  # Kelemen: no lens steps
    assert seen == [9e-4, None]


def test_render_passes_the_small_step_and_the_large_step_probability(monkeypatch):
    """``render(..., small_step="isotropic", large_step_prob=...)`` reaches render_mlt (the
    equal-time harness' isotropic baselines, spec 1.6, and its ``--large-step-prob``): the
    share of large steps follows the probability."""
    from edge_rt import scenes
    seen = []
    monkeypatch.setattr(render_module, "render_mlt",
                        lambda *a, **kw: seen.append(kw.get("small_step")) or render_mlt(*a, **kw))
    scene = scenes.cornell_box()
    scene.camera.resolution = (8, 6)
    kw = dict(mutations_per_pixel=64, chains=64, direct_spp=0, sigma2=1e-4)
    shares = []
    for p in (0.1, 0.6):
        _, stats, mutations, *_ = render_module.render(scene, "pssmlt", small_step="isotropic",
                                                      large_step_prob=p, **kw)
        shares.append(stats["large"].proposed / mutations)
        assert stats["small"].proposed > 0 and 0 < stats["small"].acceptance < 1
    assert abs(shares[0] - 0.1) < 0.03 and abs(shares[1] - 0.6) < 0.05, shares
    assert seen == ["isotropic", "isotropic"]


def _json_scene(path, lit):
    """A floor quad seen from above, lit (or not) by a small quad facing it."""
    floor = {"vertices": [[-1, 0, -1], [-1, 0, 1], [1, 0, 1], [1, 0, -1]],
             "faces": [[0, 1, 2], [0, 2, 3]]}
    light = {"vertices": [[-0.2, 1, -0.2], [0.2, 1, -0.2], [0.2, 1, 0.2], [-0.2, 1, 0.2]],
             "faces": [[0, 1, 2], [0, 2, 3]], "emission": [5, 5, 5]}
    cam = {"position": [0, 2, 2.5], "target": [0, 0, 0], "resolution": [8, 8]}
    path.write_text(json.dumps({"camera": cam, "meshes": [floor, light] if lit else [floor]}))
    return path


def test_json_scene_with_size(tmp_path, capsys):
    scene = _json_scene(tmp_path / "floor.json", lit=True)
    rc, out, _ = _run(capsys, scene, "--method", "pssmlt", "--size", 12, 10, "--mutations", 2,
                      "--chains", 32, "--max-length", 4, "--direct-spp", 1, "--out", tmp_path)
    assert rc == 0, out
    assert edge_rt.read_exr(tmp_path / "floor_pssmlt.exr").shape == (10, 12, 3)
    assert "floor 12x10, pssmlt, paths of 3..4 segments" in out


@pytest.mark.parametrize("argv, message", [
    (["cornell_box", "--method", "bdpt"], "unknown --method 'bdpt': use h2mc, mmlt or pssmlt"),
    (["no_such_scene", "--method", "h2mc"], "unknown scene 'no_such_scene'"),
    (["cornell_box", "--method", "h2mc", "--size", "0", "12"], "bad --size 0 12"),
    (["cornell_box", "--method", "h2mc", "--size", "16"], "--size: expected 2 arguments"),
    (["cornell_box", "--method", "h2mc", "--time", "-1"], "--time must be positive"),
    (["textured_sphere", "--method", "h2mc"], "environment maps are not supported"),
    (["DARK", "--method", "pssmlt"], "the scene has no light"),
    (["BROKEN", "--method", "pssmlt"], "bad scene file"),
    (["cornell_box", "--method", "h2mc", "--time-mode", "joint"],
     "argument --time-mode: invalid choice: 'joint'"),
    (["cornell_box", "--method", "pssmlt", "--parameterization", "modified", "--size", "8",
      "6"], "--parameterization modified needs --method h2mc or mmlt"),
    (["cornell_box", "--method", "h2mc", "--parameterization", "modified", "--lens-prob",
      "1.5", "--size", "8", "6"], "need 0 <= --lens-prob <= 1"),
    (["cornell_box", "--method", "pssmlt", "--bootstrap", "0"], "--bootstrap >= 1"),
    (["cornell_box", "--method", "h2mc", "--sigma2", "-1"],
     "need 'auto' or a positive variance, got '-1'"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "broken.json").write_text("{not json")
    files = {"DARK": str(_json_scene(tmp_path / "dark.json", lit=False)),
             "BROKEN": str(tmp_path / "broken.json")}
    argv = [files.get(a, a) for a in argv]
    rc, _, err = _run(capsys, *argv, "--out", tmp_path)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("h2mc-render: error: ") and message in err
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize("time_mode", ["hessian", "independent"])
def test_time_mode_reaches_render_mlt(tmp_path, capsys, monkeypatch, time_mode):
    import h2mc.render as cli

    seen = []

    def spy(*args, **kw):
        seen.append(kw["time_mode"])
        return render_mlt(*args, **kw)

    monkeypatch.setattr(cli, "render_mlt", spy)
    rc, _, err = _run(capsys, "cornell_box", "--method", "pssmlt", "--size", 8, 6,
                      "--mutations", 1, "--chains", 16, "--direct-spp", 0,
                      "--time-mode", time_mode, "--out", tmp_path)
    assert rc == 0, err
    assert seen == [time_mode]


def test_bootstrap_samples_reach_render_mlt(tmp_path, capsys, monkeypatch):
    import h2mc.render as cli

    seen = []

    def spy(*args, **kw):
        seen.append(kw["bootstrap_samples"])
        return render_mlt(*args, **kw)

    monkeypatch.setattr(cli, "render_mlt", spy)
    argv = ["cornell_box", "--method", "pssmlt", "--size", 8, 6, "--mutations", 1,
            "--chains", 16, "--direct-spp", 0, "--out", tmp_path]
    for extra in ([], ["--bootstrap", 5000]):
        rc, _, err = _run(capsys, *argv, *extra)
        assert rc == 0, err
    assert seen == [None, 5000]


@pytest.mark.parametrize("light", [True, False])
def test_modified_coordinates_reach_render_mlt_and_render(tmp_path, capsys, monkeypatch, light):
    """``--parameterization modified``: the path space is built in the thesis' coordinates
    (light coordinates unless ``--no-light-coordinates``) and render_mlt gets them and the
    lens probability; the render is finite."""
    import h2mc.render as cli

    seen = []

    def spy(*args, **kw):
        ps = kw["path_space"]
        seen.append((kw["parameterization"], kw["lens_perturb_prob"], kw["light_coordinates"],
                     ps.roughness_threshold, ps.light_coordinates))
        return render_mlt(*args, **kw)

    monkeypatch.setattr(cli, "render_mlt", spy)
    argv = ["cornell_box", "--method", "mmlt", "--size", 8, 6, "--mutations", 1, "--chains", 16,
            "--direct-spp", 0, "--parameterization", "modified", "--lens-prob", 0.1,
            "--roughness-threshold", 0.05, "--out", tmp_path]
    rc, out, err = _run(capsys, *argv, *([] if light else ["--no-light-coordinates"]))
    assert rc == 0, err
    assert seen == [("modified", 0.1, light, 0.05, light)]
    assert np.isfinite(edge_rt.read_exr(tmp_path / "cornell_box_mmlt.exr")).all()


@pytest.mark.parametrize("modified", [False, True])
def test_bidirectional_reaches_the_path_space(tmp_path, capsys, monkeypatch, modified):
    """``--bidirectional``: render_mlt gets a path space with every BDPT technique; in the
    modified coordinates with light coordinates and the spec's lens perturbation
    probability (0.3), as unidirectional."""
    import h2mc.render as cli

    seen = []

    def spy(*args, **kw):
        ps = kw["path_space"]
        seen.append((kw["bidirectional"], ps.techniques, ps.roughness_threshold,
                     ps.light_coordinates, kw["lens_perturb_prob"]))
        return render_mlt(*args, **kw)

    monkeypatch.setattr(cli, "render_mlt", spy)
    extra = ["--parameterization", "modified"] if modified else []
    rc, _, err = _run(capsys, "cornell_box", "--method", "h2mc", "--size", 8, 6, "--mutations",
                      1, "--chains", 16, "--direct-spp", 0, "--bidirectional", *extra, "--out",
                      tmp_path)
    assert rc == 0, err
    assert seen == [(True, [(3, 0), (3, 1), (3, 2), (3, 3)], 0.03 if modified else None,
                     modified, 0.3)]
    assert np.isfinite(edge_rt.read_exr(tmp_path / "cornell_box_h2mc.exr")).all()


def test_module_entry_point_exit_status():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-m", "h2mc.render", "cornell_box", "--method", "bdpt"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "--method" in p.stderr and p.stderr.count("\n") == 1


def test_sigma2_auto_reports_the_pilots_choice(tmp_path, capsys):
    """``--sigma2 auto``: render_mlt's pilot runs choose H2MC's prior variance, printed with
    the acceptance; a given variance is printed as given."""
    common = ["cornell_box", "--method", "h2mc", "--size", 8, 6, "--mutations", 1, "--chains",
              16, "--direct-spp", 0, "--out", tmp_path]
    rc, out, err = _run(capsys, *common, "--sigma2", "auto")
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("H2MC prior variance"))
    assert line.endswith("(auto: pilot runs)") and float(line.split()[4]) in AUTO_SIGMA2
    rc, out, err = _run(capsys, *common, "--sigma2", "4e-4")
    assert rc == 0 and "H2MC prior variance sigma2: 0.0004\n" in out
