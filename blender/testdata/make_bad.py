"""Writes the bad scenes the inspection tests reject, next to a copy of the example scene.

Run: blender -b --factory-startup --python make_bad.py -- EXAMPLE_BLEND OUTDIR
"""
import os
import shutil
import sys

import bpy

example, out = sys.argv[sys.argv.index("--") + 1:][:2]
ex_dir = os.path.dirname(example)

def fresh():
    bpy.ops.wm.open_mainfile(filepath=example, load_ui=False)

os.makedirs(os.path.join(out, "lib"), exist_ok=True)

# A linked library, then a scene linking an object from it (the library is deleted by the test).
bpy.ops.wm.read_factory_settings(use_empty=True)
bpy.ops.mesh.primitive_cube_add()
bpy.context.object.name = "LibCube"
bpy.ops.wm.save_as_mainfile(filepath=os.path.join(out, "lib", "props.blend"))

fresh()
with bpy.data.libraries.load(os.path.join(out, "lib", "props.blend"), link=True, relative=True) as (src, dst):
    dst.objects = ["LibCube"]
for o in dst.objects:
    bpy.context.scene.collection.objects.link(o)
bpy.ops.wm.save_as_mainfile(filepath=os.path.join(out, "linked.blend"), relative_remap=True)

# A scene whose auto-run script would have to run.
fresh()
t = bpy.data.texts.new("rig.py")
t.write("import bpy\n")
t.use_module = True
bpy.ops.wm.save_as_mainfile(filepath=os.path.join(out, "autoexec.blend"), relative_remap=True)

# A scene with no camera.
fresh()
bpy.data.objects.remove(bpy.data.objects["Camera"])
bpy.ops.wm.save_as_mainfile(filepath=os.path.join(out, "nocamera.blend"), relative_remap=True)

# A scene referring to its texture by an absolute path.
fresh()
img = bpy.data.images["checker.png"]
img.filepath = os.path.join(ex_dir, "textures", "checker.png")
bpy.ops.wm.save_as_mainfile(filepath=os.path.join(out, "absolute.blend"), relative_remap=False)

# A scene with adaptive sampling, denoising and compositing on.
fresh()
sc = bpy.context.scene
sc.cycles.use_adaptive_sampling = True
sc.cycles.use_denoising = True
if hasattr(sc, "compositing_node_group"):  # 5.0: the compositor is a node group of its own
    sc.compositing_node_group = bpy.data.node_groups.new("Compositing", "CompositorNodeTree")
else:
    sc.use_nodes = True
bpy.ops.wm.save_as_mainfile(filepath=os.path.join(out, "unsplittable.blend"), relative_remap=True)
