"""Render a scene exported by ``bench_luxcore.py`` with LuxCore (pyluxcore), in its own
process: pyluxcore preloads TBB's malloc proxy, which crashes a process that already holds
memory from other allocators (llvmlite, torch), so it never shares one with our code.

    python _luxcore_worker.py SCENE.npz SAMPLER SPP [SPP ...] OUT.npz

SCENE.npz: per mesh ``v{i}`` (V, 3) and ``f{i}`` (F, 3), ``kd`` (M, 3), ``emission`` (M, 3),
the camera's ``origin``, ``target``, ``up``, ``fov`` (degrees), ``size`` (w, h),
``max_depth`` (LuxCore's path.pathdepth.total), ``threads``. One render session runs until the
largest SPP; at each SPP the film's RGB output is stored with the elapsed wall time (OUT.npz:
``spp``, ``seconds``, ``images`` (K, h, w, 3)).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np


def _scene(pyluxcore, d):
    scene, props = pyluxcore.Scene(), pyluxcore.Properties()
    lines = []
    for i in range(len(d["kd"])):
        v, f = d[f"v{i}"].astype(np.float32), d[f"f{i}"].astype(np.int32)
        scene.DefineMesh(f"mesh{i}", [tuple(map(float, p)) for p in v],
                         [tuple(map(int, t)) for t in f], None, None, None, None)
        kd, le = d["kd"][i], d["emission"][i]
        lines += [f"scene.materials.mat{i}.type = matte",
                  f"scene.materials.mat{i}.kd = {kd[0]} {kd[1]} {kd[2]}"]
        if le.any():
            lines.append(f"scene.materials.mat{i}.emission = {le[0]} {le[1]} {le[2]}")
        lines += [f"scene.objects.obj{i}.shape = mesh{i}",
                  f"scene.objects.obj{i}.material = mat{i}"]
    o, t, u = d["origin"], d["target"], d["up"]
    lines += ['scene.camera.type = "perspective"',
              f"scene.camera.lookat.orig = {o[0]} {o[1]} {o[2]}",
              f"scene.camera.lookat.target = {t[0]} {t[1]} {t[2]}",
              f"scene.camera.up = {u[0]} {u[1]} {u[2]}",
              f"scene.camera.fieldofview = {float(d['fov'])}"]
    props.SetFromString("\n".join(lines))
    scene.Parse(props)
    return scene


def main(scene_path, sampler, *rest):
    import pyluxcore

    *spps, out_path = rest
    spps = sorted(int(s) for s in spps)
    pyluxcore.Init()
    d = np.load(scene_path)
    w, h = (int(x) for x in d["size"])
    depth = int(d["max_depth"])
    cfg = pyluxcore.Properties()
    cfg.SetFromString("\n".join([
        "renderengine.type = PATHCPU", f"sampler.type = {sampler}",
        f"path.pathdepth.total = {depth}", f"path.pathdepth.diffuse = {depth}",
        f"path.pathdepth.glossy = {depth}", f"path.pathdepth.specular = {depth}",
        f"film.width = {w}", f"film.height = {h}", "film.filter.type = NONE",
        f"batch.haltspp = {spps[-1]}", f"native.threads.count = {int(d['threads'])}",
        "film.outputs.0.type = RGB", "film.outputs.0.filename = unused.exr"]))
    session = pyluxcore.RenderSession(pyluxcore.RenderConfig(cfg, _scene(pyluxcore, d)))
    images, seconds, done = [], [], []
    t0 = time.perf_counter()
    session.Start()
    for target in spps:
        while True:
            session.UpdateStats()
            spp = session.GetStats().Get("stats.renderengine.pass").GetInt()
            if spp >= target or session.HasDone():
                break
            time.sleep(0.002)
        image = np.zeros((h, w, 3), np.float32)
        session.GetFilm().GetOutputFloat(pyluxcore.FilmOutputType.RGB, image)
        images.append(image)
        seconds.append(time.perf_counter() - t0)
        done.append(spp)
    session.Stop()
    np.savez(out_path, spp=np.array(done), seconds=np.array(seconds), images=np.stack(images))


if __name__ == "__main__":
    main(*sys.argv[1:])
    sys.stdout.flush()
    os._exit(0)  # pyluxcore's exit handlers can abort the interpreter (GIL state at exit)
