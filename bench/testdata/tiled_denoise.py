"""Renders the example three ways on one Blender line, for BenchmarkTiledDenoise: Blender's own
denoised frame (own.exr, with its Noisy Image), the frame undenoised with the denoising data
passes, as an exact assembly of tiles holds it (noisy.exr), and that frame denoised once by
Cycles' own denoiser with the scene's denoising settings (after.exr).

Run: python driver-less, as a bpy build: PYTHON tiled_denoise.py -- EXAMPLE.blend OUTDIR
"""
import os
import sys

import bpy

example, out = sys.argv[sys.argv.index("--") + 1:][:2]
bpy.ops.wm.open_mainfile(filepath=example, load_ui=False, use_scripts=False)
sc = bpy.context.scene
r, cy = sc.render, sc.cycles
r.resolution_x, r.resolution_y, r.resolution_percentage = 160, 120, 100
cy.samples, cy.use_adaptive_sampling = 32, False
r.threads_mode, r.threads = "FIXED", 1
r.use_compositing = False
r.use_motion_blur = False
s = r.image_settings
s.file_format, s.color_depth, s.exr_codec = "OPEN_EXR_MULTILAYER", "32", "NONE"
r.use_file_extension = False
vl = sc.view_layers[0]
vl.cycles.denoising_store_passes = True
vl.use_pass_vector = True  # the denoise operator wants it
cy.use_denoising = True
r.filepath = os.path.join(out, "own.exr")
bpy.ops.render.render(write_still=True)
cy.use_denoising = False
r.filepath = os.path.join(out, "noisy.exr")
bpy.ops.render.render(write_still=True)
cy.use_denoising = True
bpy.ops.cycles.denoise_animation(input_filepath=os.path.join(out, "noisy.exr"), output_filepath=os.path.join(out, "after.exr"))
