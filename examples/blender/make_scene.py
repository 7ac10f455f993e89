"""Builds examples/blender/scene.blend and its texture.

Run: blender -b --factory-startup --python make_scene.py -- OUTDIR
"""
import math
import os
import sys

import bpy

out = os.path.abspath(sys.argv[sys.argv.index("--") + 1] if "--" in sys.argv else os.path.dirname(__file__))
tex_dir = os.path.join(out, "textures")
os.makedirs(tex_dir, exist_ok=True)

# Start empty.
bpy.ops.wm.read_factory_settings(use_empty=True)
scene = bpy.context.scene
scene.name = "Shot"

# A checker texture written as a file next to the scene.
size = 64
img = bpy.data.images.new("checker", width=size, height=size, alpha=False)
px = []
for y in range(size):
    for x in range(size):
        on = ((x // 8) + (y // 8)) % 2 == 0
        px += [0.9, 0.75, 0.2, 1.0] if on else [0.1, 0.2, 0.5, 1.0]
img.pixels = px
tex_path = os.path.join(tex_dir, "checker.png")
img.filepath_raw = tex_path
img.file_format = "PNG"
img.save()
bpy.data.images.remove(img)


def material(name, color=None, image=None, roughness=0.5, metallic=0.0, emission=None):
    m = bpy.data.materials.new(name)
    m.use_nodes = True
    nt = m.node_tree
    bsdf = nt.nodes["Principled BSDF"]
    bsdf.inputs["Roughness"].default_value = roughness
    bsdf.inputs["Metallic"].default_value = metallic
    if color:
        bsdf.inputs["Base Color"].default_value = (*color, 1.0)
    if image:
        tex = nt.nodes.new("ShaderNodeTexImage")
        tex.image = bpy.data.images.load(image)
        nt.links.new(tex.outputs["Color"], bsdf.inputs["Base Color"])
    if emission:
        bsdf.inputs["Emission"].default_value = (*emission, 1.0)
        bsdf.inputs["Emission Strength"].default_value = 4.0
    return m


floor_mat = material("Floor", image=tex_path, roughness=0.8)
red = material("Red", color=(0.8, 0.1, 0.08), roughness=0.3)
metal = material("Metal", color=(0.9, 0.9, 0.9), roughness=0.15, metallic=1.0)
lamp = material("Lamp", color=(1, 1, 1), emission=(1.0, 0.8, 0.6))

bpy.ops.mesh.primitive_plane_add(size=8, location=(0, 0, 0))
floor = bpy.context.object
floor.name = "Floor"
floor.data.materials.append(floor_mat)

bpy.ops.mesh.primitive_uv_sphere_add(radius=0.7, location=(-1.0, 0.3, 0.7), segments=32, ring_count=16)
s = bpy.context.object
s.name = "RedBall"
bpy.ops.object.shade_smooth()
s.data.materials.append(red)

bpy.ops.mesh.primitive_torus_add(location=(1.1, -0.2, 0.45), major_radius=0.6, minor_radius=0.22)
t = bpy.context.object
t.name = "Torus"
t.rotation_euler = (math.radians(60), 0, math.radians(20))
bpy.ops.object.shade_smooth()
t.data.materials.append(metal)

bpy.ops.mesh.primitive_ico_sphere_add(radius=0.25, location=(0.2, 1.4, 2.2), subdivisions=2)
l = bpy.context.object
l.name = "LampBall"
l.data.materials.append(lamp)

light = bpy.data.lights.new("Key", type="AREA")
light.energy = 300
light.size = 2
key = bpy.data.objects.new("Key", light)
key.location = (2.5, -2.5, 4)
key.rotation_euler = (math.radians(40), 0, math.radians(45))
scene.collection.objects.link(key)

world = bpy.data.worlds.new("World")
world.use_nodes = True
world.node_tree.nodes["Background"].inputs["Color"].default_value = (0.05, 0.07, 0.1, 1)
world.node_tree.nodes["Background"].inputs["Strength"].default_value = 1.0
scene.world = world

# An animated camera: a dolly from left to right across frames 1-24, always aimed at the centre.
cam_data = bpy.data.cameras.new("Camera")
cam_data.lens = 35
cam = bpy.data.objects.new("Camera", cam_data)
scene.collection.objects.link(cam)
scene.camera = cam
target = bpy.data.objects.new("Target", None)
target.location = (0, 0, 0.5)
scene.collection.objects.link(target)
track = cam.constraints.new("TRACK_TO")
track.target = target
track.track_axis = "TRACK_NEGATIVE_Z"
track.up_axis = "UP_Y"
scene.frame_start, scene.frame_end = 1, 24
for frame, x in ((1, -3.5), (24, 3.5)):
    cam.location = (x, -5.5, 2.6)
    cam.keyframe_insert("location", frame=frame)

r = scene.render
r.engine = "CYCLES"
r.resolution_x, r.resolution_y, r.resolution_percentage = 160, 120, 100
r.film_transparent = False
c = scene.cycles
c.device = "CPU"
c.samples = 32
c.use_adaptive_sampling = False
c.use_denoising = False
c.max_bounces = 6
c.seed = 7
scene.view_settings.view_transform = "Filmic"
scene.view_settings.look = "None"
scene.view_settings.exposure = 0.3

# Paths relative to the .blend, so the scene moves with its directory.
blend = os.path.join(out, "scene.blend")
bpy.ops.wm.save_as_mainfile(filepath=blend, relative_remap=True, compress=True)
print("wrote", blend)
