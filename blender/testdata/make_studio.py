"""Builds a studio-like project from the example scene, for the tests and the benchmark of
scenes sent by content: OUT/shot.blend renders the example with a cube linked from
OUT/lib/props.blend (whose material reads the library's own texture, //tex/props.png relative
to the library), and names FILES more files of BYTES bytes each that Blender keeps as images
(fake users, not rendered): half an image sequence OUT/seq/f_0001.png..., half single textures
OUT/tex/t_0001.png..., an OpenVDB sequence OUT/vdb/smoke_0001.vdb... of a volume, and a particle system baked to a disk cache, OUT/blendcache_shot/. Their bytes are a seeded PRNG's, so two runs make the same project.

Run: blender -b --factory-startup --python make_studio.py -- EXAMPLE.blend OUT FILES BYTES
"""
import os
import random
import shutil
import sys

import bpy

example, out, files, size = sys.argv[sys.argv.index("--") + 1:][:4]
files, size = int(files), int(size)
os.makedirs(os.path.join(out, "lib", "tex"), exist_ok=True)
os.makedirs(os.path.join(out, "tex"), exist_ok=True)
os.makedirs(os.path.join(out, "seq"), exist_ok=True)
ex_dir = os.path.dirname(os.path.abspath(example))
shutil.copytree(os.path.join(ex_dir, "textures"), os.path.join(out, "textures"), dirs_exist_ok=True)
shutil.copy(os.path.join(ex_dir, "textures", "checker.png"), os.path.join(out, "lib", "tex", "props.png"))

# The library: a cube whose material reads the library's own texture.
bpy.ops.wm.read_factory_settings(use_empty=True)
bpy.ops.mesh.primitive_cube_add(size=0.6, location=(1.2, 0.4, 0.3))
cube = bpy.context.object
cube.name = "PropCube"
mat = bpy.data.materials.new("PropMat")
mat.use_nodes = True
tex = mat.node_tree.nodes.new("ShaderNodeTexImage")
tex.image = bpy.data.images.load(os.path.join(out, "lib", "tex", "props.png"))
mat.node_tree.links.new(tex.outputs["Color"], mat.node_tree.nodes["Principled BSDF"].inputs["Base Color"])
cube.data.materials.append(mat)
bpy.ops.wm.save_as_mainfile(filepath=os.path.join(out, "lib", "props.blend"), relative_remap=True)

# The shot: the example scene, the linked cube, and the many files. Saved twice (before and
# after the bake), without Blender's .blend1 backup beside it.
bpy.context.preferences.filepaths.save_version = 0
bpy.ops.wm.open_mainfile(filepath=example, load_ui=False)
# Saved where the project is first, its own relative paths kept ("//textures/..." is copied
# beside it), so the paths below are relative to the shot.
shot = os.path.join(out, "shot.blend")
bpy.ops.wm.save_as_mainfile(filepath=shot, relative_remap=False)
sc = bpy.context.scene
with bpy.data.libraries.load(os.path.join(out, "lib", "props.blend"), link=True, relative=True) as (src, dst):
    dst.objects = ["PropCube"]
for o in dst.objects:
    sc.collection.objects.link(o)
rng = random.Random(7)
seq = files // 2
for i in range(files):
    name = os.path.join("seq", "f_%04d.png" % (i + 1)) if i < seq else os.path.join("tex", "t_%04d.png" % (i - seq + 1))
    with open(os.path.join(out, name), "wb") as f:
        f.write(rng.randbytes(size))
if seq:
    img = bpy.data.images.new("Sequence", 4, 4)
    img.source = "SEQUENCE"
    img.filepath = "//seq/f_0001.png"
    img.use_fake_user = True
for i in range(files - seq):
    img = bpy.data.images.new("Tex%04d" % (i + 1), 4, 4)
    img.source = "FILE"
    img.filepath = "//tex/t_%04d.png" % (i + 1)
    img.use_fake_user = True
# An OpenVDB sequence a volume names (a fake user: not rendered), three frames.
os.makedirs(os.path.join(out, "vdb"), exist_ok=True)
for i in range(3):
    with open(os.path.join(out, "vdb", "smoke_%04d.vdb" % (i + 1)), "wb") as f:
        f.write(rng.randbytes(64))
vol = bpy.data.volumes.new("Smoke")
vol.filepath = "//vdb/smoke_0001.vdb"
vol.is_sequence = True
vol.use_fake_user = True
# A point cache: particles baked to //blendcache_shot/ for the first frames, out of the
# camera's view (the frame is the example's), which Blender reads back when it renders them.
bpy.ops.mesh.primitive_plane_add(size=0.2, location=(0, 0, -50))
emitter = bpy.context.object
emitter.name = "Emitter"
emitter.modifiers.new("Particles", "PARTICLE_SYSTEM")
ps = emitter.particle_systems[0]
ps.settings.count = 20
ps.settings.frame_start, ps.settings.frame_end = 1, 2
pc = ps.point_cache
pc.use_disk_cache = True
pc.frame_start, pc.frame_end = 1, 3
bpy.ops.wm.save_as_mainfile(filepath=shot, relative_remap=False)
with bpy.context.temp_override(point_cache=pc):
    bpy.ops.ptcache.bake(bake=True)
bpy.ops.wm.save_as_mainfile(filepath=shot, relative_remap=False)
