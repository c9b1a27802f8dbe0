"""redner 0.4.28 as a peer of the benchmarks: an edge_rt scene exported to an npz that
``redner_driver.py`` reads (so that both renderers provably render the same scene), the
Python 3.8 interpreter that has redner, and a driver process serving render requests.

redner's only wheels are for Python <= 3.8. Install it outside the repository, e.g.::

    $(pyenv root)/versions/3.8.18/bin/python3.8 -m venv /work/venv-redner38
    /work/venv-redner38/bin/pip install redner==0.4.28 numpy
    export EDGE_RT_REDNER_PYTHON=/work/venv-redner38/bin/python
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from pathlib import Path

import numpy as np

from edge_rt.scene import SceneError

DRIVER = Path(__file__).with_name("redner_driver.py")
ENV_VAR = "EDGE_RT_REDNER_PYTHON"


def scene_arrays(scene) -> dict[str, np.ndarray]:
    """The arrays ``redner_driver.ExportedScene`` reads: the pinhole camera and, per mesh, its
    vertices, faces, constant materials and emission. Refuses what the driver does not
    translate (textures, shading normals, dielectrics, environment maps, other cameras)."""
    cam = scene.camera
    if cam.kind != "pinhole" or cam.thin_lens:
        raise SceneError("redner export: only the pinhole camera without a lens is exported")
    if scene.envmap is not None:
        raise SceneError("redner export: environment maps are not exported")
    out = {"camera.cam_to_world": _array(cam.cam_to_world),
           "camera.fov": _array(cam.fov),
           "camera.resolution": np.array(cam.resolution),
           "camera.clip_near": np.array(cam.clip_near),
           "meshes": np.array(len(scene.meshes))}
    for k, m in enumerate(scene.meshes):
        mat = m.material
        if mat.is_dielectric or m.normals is not None or m.velocity is not None:
            raise SceneError(f"redner export: mesh {m.name!r} is a dielectric, has shading "
                             "normals or moves (not exported)")
        for field in ("diffuse", "specular", "roughness"):
            if not getattr(mat, field).is_constant:
                raise SceneError(f"redner export: mesh {m.name!r}: textured {field} is not "
                                 "exported")
        p = f"mesh{k}."
        out[p + "name"] = np.array(m.name)
        out[p + "vertices"] = _array(m.vertices)
        out[p + "faces"] = _array(m.faces).astype(np.int64)
        out[p + "diffuse"] = _array(mat.diffuse.values)
        out[p + "specular"] = _array(mat.specular.values)
        out[p + "roughness"] = _array(mat.roughness.values)
        if m.emission is not None:
            out[p + "emission"] = _array(m.emission)
    return out


def _array(t):
    return t.detach().cpu().numpy().copy() if hasattr(t, "detach") else np.asarray(t)


def export_scene(scene, path, target=None, weights=None):
    """Write ``scene_arrays(scene)`` to ``path`` (an npz), with the loss's ``target`` image or
    linear ``weights`` (H, W, 3) when given (see redner_driver's docstring)."""
    arrays = scene_arrays(scene)
    for name, img in (("target", target), ("weights", weights)):
        if img is not None:
            arrays[name] = _array(img).astype(np.float32)
    np.savez(path, **arrays)
    return path


def find_python() -> tuple[str | None, str]:
    """(interpreter that imports redner, None) or (None, a one-line note why there is none):
    ``$EDGE_RT_REDNER_PYTHON`` first, else pyenv's Pythons 3.6-3.8."""
    env = os.environ.get(ENV_VAR)
    if env:
        candidates = [env]
    else:
        root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        candidates = sorted(glob.glob(f"{root}/versions/3.[678].*/bin/python3.[678]"),
                            reverse=True)
    if not candidates:
        return None, (f"redner skipped: no Python <= 3.8 (set {ENV_VAR} to a Python 3.8 with "
                      "redner==0.4.28 installed)")
    for py in candidates:
        try:
            ok = subprocess.run([py, "-c", "import redner"], capture_output=True,
                                timeout=60).returncode == 0
        except OSError:
            ok = False
        if ok:
            return py, ""
    return None, (f"redner skipped: {', '.join(candidates)} cannot import redner (make a venv "
                  f"with redner==0.4.28 and numpy, then set {ENV_VAR}; see redner_peer.py)")


class RednerProcess:
    """``redner_driver.py --serve`` in a subprocess: ``request(op, **options)`` sends one
    request and returns the reply. ``threads`` below the machine's core count pins the
    process to that many cores (redner starts one thread per core and has no option)."""

    def __init__(self, python, scene_npz, threads=None, **options):
        cmd = [python, str(DRIVER), str(scene_npz), "--serve"]
        for k, v in options.items():
            flag = "--" + k.replace("_", "-")
            cmd += [flag] if v is True else [] if v is False else [flag, str(v)]
        cores = os.cpu_count() or 1
        self.cores = min(threads or cores, cores)
        pin = None
        if self.cores < cores:
            def pin():
                os.sched_setaffinity(0, range(self.cores))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, preexec_fn=pin)

    def request(self, op, **options):
        self.proc.stdin.write(json.dumps({"op": op, **options}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"redner driver exited (code {self.proc.wait()}) on {op!r}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"redner driver: {reply['error']}")
        return reply

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def report_arrays(reply):
    """The image (H, W, 3) and vertex gradient (V, 3) of a driver report."""
    image = np.asarray(reply["image"], dtype=np.float32).reshape(reply["image_shape"])
    grad = np.asarray(reply["grad_vertices"], dtype=np.float64).reshape(reply["grad_shape"])
    return image, grad
