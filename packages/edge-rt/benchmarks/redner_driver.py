"""redner 0.4.28 (Li et al. 2018) on a scene exported by edge_rt (``redner_peer.export_scene``),
driven through its C++ core with NumPy buffers: it runs under Python <= 3.8 (redner's only
wheels), where pyredner's PyTorch front end cannot be imported (PyPI has CUDA-only torch for
3.8). The pointer plumbing follows pyredner 0.4.28's ``RenderFunction`` (render_pytorch.py).

What pyredner's ``render_pathtracing`` does by default, and this driver too: Sobol sampler,
box pixel filter, forward and backward passes with independent seeds (seed, seed + 1000003),
the scene (and its Embree BVH) rebuilt for every render, gradient buffers for every scene
parameter, primary and secondary edge sampling (``--edges primary``: no secondary edges, what
edge_rt samples; ``--edges none``: the interior derivatives alone). Materials are two-sided (edge_rt shades both sides), lights one-sided.

Two modes, both writing JSON to stdout:

* ``redner_driver.py SCENE.npz --spp 4 --max-bounces 2 --repeats 3``: one report with the
  forward and forward+backward times of every repeat, the forward image (H, W, 3) and the
  gradient of the loss w.r.t. the vertices of mesh ``--grad-mesh``.
* ``--serve``: one JSON request a line on stdin (``{"op": "forward" | "fwd_bwd" | "result",
  ...options}``: a time, a time, or one forward+backward's image and gradient), one JSON
  reply a line, so that a benchmark can interleave redner's runs with
  its own (``redner_peer.RednerProcess``).

The loss is ``mean((image - target)^2)`` against the npz's ``target`` (H, W, 3) when it has
one, else against a render of the same scene at seed 99; or ``mean(weights * image)`` when
the npz has ``weights`` (a linear functional, whose gradient two renderers can compare
without a target's noise).
"""

import argparse
import json
import sys
import time

import numpy as np

try:
    import redner
except ImportError:  # ExportedScene's reading is numpy only: Python 3.11 tests import it
    redner = None

BACKWARD_SEED_OFFSET = 1000003  # pyredner's: decorrelates the backward pass's samples
EDGES = ("primary+secondary", "primary", "none")  # which edges redner samples


def _fp(a):
    return redner.float_ptr(0 if a is None else a.ctypes.data)


def _texture3(value):
    return redner.Texture3([_fp(value)], [0], [0], 3, _fp(_UV_SCALE))


def _texture1(value):
    return redner.Texture1([_fp(value)], [0], [0], 1, _fp(_UV_SCALE))


_UV_SCALE = np.ones(2, dtype=np.float32)


def _f32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


class ExportedScene:
    """The npz's arrays as redner objects. redner keeps raw pointers into the arrays, so they
    live as long as this object."""

    def __init__(self, path):
        data = np.load(path)
        self.cam_to_world = _f32(data["camera.cam_to_world"])
        self.world_to_cam = _f32(np.linalg.inv(data["camera.cam_to_world"]))
        # pyredner's intrinsic matrix for a horizontal field of view (its fov argument)
        f = 1.0 / np.tan(np.radians(0.5 * float(data["camera.fov"])))
        self.intrinsic = _f32(np.diag([f, f, 1.0]))
        self.intrinsic_inv = _f32(np.linalg.inv(self.intrinsic))
        self.width, self.height = (int(x) for x in data["camera.resolution"])
        self.clip_near = float(data["camera.clip_near"])
        self.meshes = []
        for k in range(int(data["meshes"])):
            p = "mesh%d." % k
            self.meshes.append({
                "name": str(data[p + "name"]),
                "vertices": _f32(data[p + "vertices"]),
                "faces": np.ascontiguousarray(data[p + "faces"], dtype=np.int32),
                "diffuse": _f32(data[p + "diffuse"]),
                "specular": _f32(data[p + "specular"]),
                "roughness": _f32(data[p + "roughness"]),
                "emission": _f32(data[p + "emission"]) if p + "emission" in data else None,
            })
        self.target = _f32(data["target"]) if "target" in data else None
        self.weights = _f32(data["weights"]) if "weights" in data else None

    def mesh_index(self, name):
        names = [m["name"] for m in self.meshes]
        if name not in names:
            raise SystemExit("redner_driver: no mesh %r in the scene (%s)" % (name, names))
        return names.index(name)

    def build(self, edges):
        """A redner.Scene (Embree BVH and edge tables built here, as pyredner does per render)."""
        camera = redner.Camera(
            self.width, self.height, _fp(None), _fp(None), _fp(None),
            _fp(self.cam_to_world), _fp(self.world_to_cam), _fp(self.intrinsic_inv),
            _fp(self.intrinsic), _fp(None), self.clip_near, redner.CameraType.perspective,
            redner.Vector2i(0, 0), redner.Vector2i(self.width, self.height))
        shapes, materials, lights = [], [], []
        for k, m in enumerate(self.meshes):
            light_id = -1
            if m["emission"] is not None:
                light_id = len(lights)
                lights.append(redner.AreaLight(k, _fp(m["emission"]), False, True))
            shapes.append(redner.Shape(
                _fp(m["vertices"]), redner.int_ptr(m["faces"].ctypes.data), _fp(None), _fp(None),
                redner.int_ptr(0), redner.int_ptr(0), _fp(None), len(m["vertices"]), 0, 0,
                len(m["faces"]), k, light_id))
            specular = bool(m["specular"].max() > 0.0)
            materials.append(redner.Material(
                _texture3(m["diffuse"]), _texture3(m["specular"]), _texture1(m["roughness"]),
                redner.TextureN([], [], [], 0, _fp(None)), redner.Texture3([], [], [], 0, _fp(None)),
                specular, True, False))
        return redner.Scene(camera, shapes, materials, lights, None, False, 0,
                            edges != "none", edges == EDGES[0])

    def gradient_buffers(self):
        """Zeroed derivative buffers for every parameter (as pyredner allocates them) and the
        redner.DScene that writes into them."""
        bufs = {"cam": [np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32),
                        np.zeros((3, 3), np.float32), np.zeros((3, 3), np.float32)],
                "vertices": [np.zeros_like(m["vertices"]) for m in self.meshes],
                "materials": [[np.zeros(3, np.float32), np.zeros(3, np.float32),
                               np.zeros(1, np.float32)] for _ in self.meshes],
                "lights": [np.zeros(3, np.float32) for m in self.meshes
                           if m["emission"] is not None]}
        d_camera = redner.DCamera(_fp(None), _fp(None), _fp(None),
                                  *(_fp(b) for b in bufs["cam"]), _fp(None))
        d_shapes = [redner.DShape(_fp(v), _fp(None), _fp(None), _fp(None))
                    for v in bufs["vertices"]]
        d_materials = [redner.DMaterial(_texture3(d), _texture3(s), _texture1(r),
                                        redner.TextureN([], [], [], 0, _fp(None)),
                                        redner.Texture3([], [], [], 0, _fp(None)))
                       for d, s, r in bufs["materials"]]
        d_lights = [redner.DAreaLight(_fp(b)) for b in bufs["lights"]]
        return bufs, redner.DScene(d_camera, d_shapes, d_materials, d_lights, None, False, 0)


class Renderer:
    def __init__(self, scene, spp, max_bounces, edges, grad_mesh):
        if edges not in EDGES:
            raise SystemExit("redner_driver: edges must be one of %s, got %r" % (EDGES, edges))
        self.scene, self.spp, self.max_bounces, self.edges = scene, spp, max_bounces, edges
        self.grad_mesh = scene.mesh_index(grad_mesh)
        self.target = scene.target

    def _options(self, seed):
        return redner.RenderOptions(seed, self.spp, self.max_bounces, [redner.channels.radiance],
                                    redner.SamplerType.sobol, False)

    def forward(self, seed, built=None):
        built = built or self.scene.build(self.edges)
        image = np.zeros((self.scene.height, self.scene.width, 3), np.float32)
        redner.render(built, self._options(seed), _fp(image), _fp(None), None, _fp(None),
                      _fp(None))
        return image

    def forward_backward(self, seed):
        """Forward render, then the backward pass of the loss: the gradient w.r.t. the vertices
        of the chosen mesh (redner computes every parameter's)."""
        built = self.scene.build(self.edges)
        image = self.forward(seed, built)
        if self.scene.weights is not None:
            d_image = _f32(self.scene.weights / image.size)
        else:
            if self.target is None:  # the benchmark's target: the same scene, another seed
                self.target = self.forward(99)
            d_image = _f32(2.0 * (image - self.target) / image.size)
        bufs, d_scene = self.scene.gradient_buffers()
        redner.render(built, self._options(seed + BACKWARD_SEED_OFFSET), _fp(None), _fp(d_image),
                      d_scene, _fp(None), _fp(None))
        return image, bufs["vertices"][self.grad_mesh]


def _timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def report(renderer, seed, repeats):
    """Times of ``repeats`` forward and forward+backward runs (the first call, Embree and
    thread start-up included, reported apart), the image and the vertex gradient."""
    first, _ = _timed(renderer.forward_backward, seed)
    build = [_timed(renderer.scene.build, renderer.edges)[0] for _ in range(repeats)]
    forward, fwd_bwd = [], []
    for _ in range(repeats):
        forward.append(_timed(renderer.forward, seed)[0])
        t, (image, grad) = _timed(renderer.forward_backward, seed)
        fwd_bwd.append(t)
    return {"redner": redner_version(), "threads": redner_threads(), "first_call": first,
            "scene_build": build, "forward": forward, "fwd_bwd": fwd_bwd,
            **_arrays_json(image, grad)}


def _arrays_json(image, grad):
    return {"image_shape": list(image.shape), "image": image.ravel().tolist(),
            "grad_shape": list(grad.shape), "grad_vertices": grad.ravel().tolist()}


def redner_version():
    try:
        from importlib.metadata import version
        return version("redner")
    except Exception:  # metadata missing in an unusual install: the version is informative only
        return "unknown"


def redner_threads():
    # redner's parallel_init starts std::thread::hardware_concurrency() threads (no option)
    import os
    return os.cpu_count()


def serve(args):
    """One request a line: {"op", "seed", "spp", "max_bounces", "edges"}."""
    renderers = {}
    for line in sys.stdin:
        req = json.loads(line)
        key = (req.get("spp", args.spp), req.get("max_bounces", args.max_bounces),
               req.get("edges", args.edges))
        if key not in renderers:
            renderers[key] = Renderer(_SCENE, *key, args.grad_mesh)
        r = renderers[key]
        seed = req.get("seed", args.seed)
        if req["op"] == "forward":
            out = {"seconds": _timed(r.forward, seed)[0]}
        elif req["op"] == "fwd_bwd":
            out = {"seconds": _timed(r.forward_backward, seed)[0]}
        elif req["op"] == "result":
            out = _arrays_json(*r.forward_backward(seed))
        else:
            out = {"error": "unknown op %r" % req["op"]}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


def main(argv=None):
    global _SCENE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scene", help="npz written by redner_peer.export_scene")
    parser.add_argument("--spp", type=int, default=4)
    parser.add_argument("--max-bounces", type=int, default=2,
                        help="redner's max_bounces (= edge_rt's max_depth: 1 is direct light)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grad-mesh", default="short_box")
    parser.add_argument("--edges", choices=EDGES, default=EDGES[0],
                        help="edge sampling: redner's default, primary edges only (what edge_rt "
                             "samples), or none (interior derivatives only)")
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args(argv)
    _SCENE = ExportedScene(args.scene)
    if args.serve:
        serve(args)
        return
    r = Renderer(_SCENE, args.spp, args.max_bounces, args.edges, args.grad_mesh)
    json.dump(report(r, args.seed, args.repeats), sys.stdout)
    sys.stdout.write("\n")


_SCENE = None

if __name__ == "__main__":
    main()
