"""Builds graded.blend from the example scene: a scene as Cycles leaves it for a final frame,
adaptive sampling on, a colour grade in the compositor, a transparent film and 16-bit RGBA PNG
output at //render/graded_####.png, frame 1 alone.

Run: blender -b --factory-startup --python make_graded.py -- EXAMPLE.blend OUTDIR
"""
import os
import sys

import bpy

example, out = sys.argv[sys.argv.index("--") + 1:][:2]
bpy.ops.wm.open_mainfile(filepath=example, load_ui=False)
sc = bpy.context.scene
# The texture packed into the .blend, so the file renders wherever it is copied.
bpy.ops.file.pack_all()
sc.frame_start = sc.frame_end = 1
sc.render.resolution_x, sc.render.resolution_y = 96, 72
sc.render.film_transparent = True
cy = sc.cycles
cy.samples = 64
cy.use_adaptive_sampling = True
cy.adaptive_threshold = 0.05
cy.adaptive_min_samples = 8
sc.use_nodes = True
nt = sc.node_tree
for n in list(nt.nodes):
    nt.nodes.remove(n)
rl = nt.nodes.new("CompositorNodeRLayers")
grade = nt.nodes.new("CompositorNodeColorBalance")
grade.correction_method = "LIFT_GAMMA_GAIN"
grade.lift = (1.02, 0.98, 0.95)
grade.gamma = (1.1, 1.0, 0.9)
grade.gain = (1.2, 1.1, 0.9)
comp = nt.nodes.new("CompositorNodeComposite")
nt.links.new(rl.outputs["Image"], grade.inputs["Image"])
nt.links.new(grade.outputs["Image"], comp.inputs["Image"])
nt.links.new(rl.outputs["Alpha"], comp.inputs["Alpha"])
s = sc.render.image_settings
s.file_format, s.color_mode, s.color_depth = "PNG", "RGBA", "16"
sc.render.filepath = "//render/graded_"
bpy.ops.wm.save_as_mainfile(filepath=os.path.join(out, "graded.blend"), relative_remap=True)
