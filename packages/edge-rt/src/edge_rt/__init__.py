"""edge_rt: a differentiable Monte Carlo path tracer with primary-visibility edge sampling.

Public modules (h2mc builds on them): :mod:`edge_rt.scene` (camera, meshes, materials,
lights, envmaps), :mod:`edge_rt.geometry` (Embree ray casting, differentiable surface
interactions, light sampling), :mod:`edge_rt.bsdf` (evaluate / sample / pdf),
:mod:`edge_rt.integrator` (the path tracer), :mod:`edge_rt.edges` (primary edge sampling),
:mod:`edge_rt.scenes` (built-in scenes, dict / OBJ / PLY loading), :mod:`edge_rt.imageio`.
"""

from . import bsdf, edges, geometry, integrator, scenes
from .imageio import read_exr, write_exr, write_png
from .renderer import (derivative_image, gradients, render, render_image,
                       torch_single_thread)
from .scene import Camera, EnvironmentMap, Material, Mesh, Scene, SceneError, look_at
from .scenes import from_dict, load_mesh
from .texture import Texture

__version__ = "0.1.0"

__all__ = [
    "Camera", "EnvironmentMap", "Material", "Mesh", "Scene", "SceneError", "Texture",
    "bsdf", "derivative_image", "edges", "from_dict", "geometry", "gradients", "integrator", "load_mesh",
    "look_at", "read_exr", "render", "render_image", "scenes", "torch_single_thread", "write_exr",
    "write_png",
]
