"""Builds examples/blender/plate.blend: a plate rendered for compositing.

Transparent film, two view layers, many passes (Depth, Position, Mist, Normal, Vector, UV,
object and material index, the diffuse, glossy and transmission light passes (a glass ball),
Emit, Environment, AO, Cryptomatte object/material/asset,
denoising data, a shader AOV and a light group), a compositor tree (Glare into Alpha Over
over a backdrop, into the Composite output, and a File Output node writing the normalised
depth as PNGs) and multilayer OpenEXR output at //render/plate_####.exr, frames 1-2: what a
studio's .blend asks of a farm, and what the farm must write exactly as Blender does.

Run: blender -b --factory-startup --python make_plate.py -- OUTDIR
"""
import math
import os
import sys

import bpy

out = os.path.abspath(sys.argv[sys.argv.index("--") + 1] if "--" in sys.argv else os.path.dirname(__file__))
os.makedirs(out, exist_ok=True)

bpy.ops.wm.read_factory_settings(use_empty=True)
scene = bpy.context.scene
scene.name = "Plate"


def material(name, color, roughness=0.5, metallic=0.0, emission=None, aov=None):
    m = bpy.data.materials.new(name)
    m.use_nodes = True
    nt = m.node_tree
    bsdf = nt.nodes["Principled BSDF"]
    bsdf.inputs["Base Color"].default_value = (*color, 1.0)
    bsdf.inputs["Roughness"].default_value = roughness
    bsdf.inputs["Metallic"].default_value = metallic
    if emission:
        bsdf.inputs["Emission"].default_value = (*emission, 1.0)
        bsdf.inputs["Emission Strength"].default_value = 3.0
    if aov:
        node = nt.nodes.new("ShaderNodeOutputAOV")
        node.name = aov
        node.inputs["Color"].default_value = (*color, 1.0)
        node.inputs["Value"].default_value = roughness
    return m


ground = material("Ground", (0.4, 0.4, 0.38), roughness=0.9, aov="tint")
red = material("Red", (0.8, 0.1, 0.08), roughness=0.3, aov="tint")
metal = material("Metal", (0.9, 0.9, 0.9), roughness=0.15, metallic=1.0, aov="tint")
glow = material("Glow", (1, 1, 1), emission=(1.0, 0.7, 0.4), aov="tint")

bpy.ops.mesh.primitive_plane_add(size=8, location=(0, 0, 0))
floor = bpy.context.object
floor.name = "Ground"
floor.data.materials.append(ground)
floor.pass_index = 1

glass = material("Glass", (0.95, 0.95, 1.0), roughness=0.05, aov="tint")
glass.node_tree.nodes["Principled BSDF"].inputs["Transmission"].default_value = 1.0

props = bpy.data.collections.new("Props")
scene.collection.children.link(props)
fx = bpy.data.collections.new("FX")
scene.collection.children.link(fx)


def link(obj, coll):
    for c in obj.users_collection:
        c.objects.unlink(obj)
    coll.objects.link(obj)


bpy.ops.mesh.primitive_uv_sphere_add(radius=0.7, location=(-1.0, 0.3, 0.7), segments=32, ring_count=16)
ball = bpy.context.object
ball.name = "RedBall"
bpy.ops.object.shade_smooth()
ball.data.materials.append(red)
ball.pass_index = 2
link(ball, props)

bpy.ops.mesh.primitive_torus_add(location=(1.1, -0.2, 0.45), major_radius=0.6, minor_radius=0.22)
torus = bpy.context.object
torus.name = "Torus"
torus.rotation_euler = (math.radians(60), 0, math.radians(20))
bpy.ops.object.shade_smooth()
torus.data.materials.append(metal)
torus.pass_index = 3
link(torus, props)

bpy.ops.mesh.primitive_uv_sphere_add(radius=0.45, location=(0.0, -1.2, 0.55), segments=24, ring_count=12)
lens = bpy.context.object
lens.name = "GlassBall"
bpy.ops.object.shade_smooth()
lens.data.materials.append(glass)
link(lens, props)

bpy.ops.mesh.primitive_ico_sphere_add(radius=0.3, location=(0.2, 1.2, 1.6), subdivisions=2)
orb = bpy.context.object
orb.name = "GlowOrb"
orb.data.materials.append(glow)
orb.pass_index = 4
link(orb, fx)

light = bpy.data.lights.new("Key", type="AREA")
light.energy = 300
light.size = 2
key = bpy.data.objects.new("Key", light)
key.location = (2.5, -2.5, 4)
key.rotation_euler = (math.radians(40), 0, math.radians(45))
key.lightgroup = "key"
scene.collection.objects.link(key)

world = bpy.data.worlds.new("World")
world.use_nodes = True
world.node_tree.nodes["Background"].inputs["Color"].default_value = (0.05, 0.07, 0.1, 1)
world.node_tree.nodes["Background"].inputs["Strength"].default_value = 1.0
scene.world = world

cam_data = bpy.data.cameras.new("Camera")
cam_data.lens = 35
cam = bpy.data.objects.new("Camera", cam_data)
scene.collection.objects.link(cam)
scene.camera = cam
cam.location = (0.5, -5.5, 2.6)
cam.rotation_euler = (math.radians(67), 0, math.radians(5))

scene.frame_start, scene.frame_end = 1, 2
orb.location.z = 1.6
orb.keyframe_insert("location", frame=1)
orb.location.z = 1.9
orb.keyframe_insert("location", frame=2)

r = scene.render
r.engine = "CYCLES"
r.resolution_x, r.resolution_y, r.resolution_percentage = 96, 72, 100
r.film_transparent = True
c = scene.cycles
c.device = "CPU"
c.samples = 16
c.use_adaptive_sampling = False
c.use_denoising = False
c.max_bounces = 4
c.seed = 11
scene.view_settings.view_transform = "Filmic"

# Two view layers: the props with every pass, and the glowing FX alone with a few.
beauty = scene.view_layers[0]
beauty.name = "Beauty"
for name in ("use_pass_z", "use_pass_mist", "use_pass_normal", "use_pass_vector", "use_pass_uv",
             "use_pass_object_index", "use_pass_material_index", "use_pass_diffuse_direct",
             "use_pass_diffuse_indirect", "use_pass_diffuse_color", "use_pass_glossy_direct",
             "use_pass_glossy_color", "use_pass_glossy_indirect", "use_pass_transmission_direct",
             "use_pass_transmission_indirect", "use_pass_transmission_color", "use_pass_position",
             "use_pass_emit", "use_pass_environment", "use_pass_ambient_occlusion",
             "use_pass_cryptomatte_object", "use_pass_cryptomatte_material", "use_pass_cryptomatte_asset"):
    setattr(beauty, name, True)
beauty.cycles.denoising_store_passes = True
aov = beauty.aovs.add()
aov.name, aov.type = "tint", "COLOR"
beauty.lightgroups.add(name="key")
beauty.layer_collection.children["FX"].exclude = True

fxl = scene.view_layers.new("FX")
fxl.use_pass_z = True
fxl.use_pass_emit = True
fxl.use_pass_vector = True  # the orb moves between frames
fxl.use_pass_cryptomatte_object = True
fxl.layer_collection.children["Props"].exclude = True

# The compositor: the beauty with a glare, over the FX layer, over a backdrop colour.
scene.use_nodes = True
nt = scene.node_tree
for n in list(nt.nodes):
    nt.nodes.remove(n)
rl_beauty = nt.nodes.new("CompositorNodeRLayers")
rl_beauty.layer = "Beauty"
rl_fx = nt.nodes.new("CompositorNodeRLayers")
rl_fx.layer = "FX"
glare = nt.nodes.new("CompositorNodeGlare")
glare.glare_type = "FOG_GLOW"
glare.quality = "HIGH"
glare.threshold = 0.6
over = nt.nodes.new("CompositorNodeAlphaOver")
nt.links.new(rl_beauty.outputs["Image"], glare.inputs["Image"])
nt.links.new(glare.outputs["Image"], over.inputs[1])
nt.links.new(rl_fx.outputs["Image"], over.inputs[2])
back = nt.nodes.new("CompositorNodeAlphaOver")
back.inputs[1].default_value = (0.2, 0.22, 0.25, 1.0)
nt.links.new(over.outputs["Image"], back.inputs[2])
comp = nt.nodes.new("CompositorNodeComposite")
nt.links.new(back.outputs["Image"], comp.inputs["Image"])
# A File Output node: the depth as a normalised matte, one PNG per frame beside the plate.
norm = nt.nodes.new("CompositorNodeNormalize")
nt.links.new(rl_beauty.outputs["Depth"], norm.inputs[0])
fo = nt.nodes.new("CompositorNodeOutputFile")
fo.base_path = "//render/depth/"
fo.format.file_format = "PNG"
fo.format.color_mode = "BW"
fo.file_slots[0].path = "depth_"
nt.links.new(norm.outputs[0], fo.inputs[0])

s = r.image_settings
s.file_format = "OPEN_EXR_MULTILAYER"
s.color_depth = "32"
s.exr_codec = "ZIP"
r.filepath = "//render/plate_"

blend = os.path.join(out, "plate.blend")
bpy.ops.wm.save_as_mainfile(filepath=blend, relative_remap=True, compress=True)
print("wrote", blend)
