# The add-on's settings: the preferences (the farm's address and token, the coordinator command;
# per user, never in a .blend) and each scene's submission settings and job (scene.tilefarm,
# saved with the .blend).

import os

import bpy
from bpy.props import BoolProperty, EnumProperty, FloatProperty, IntProperty, StringProperty

from . import farm


class TilefarmPreferences(bpy.types.AddonPreferences):
    bl_idname = __package__

    server: StringProperty(
        name="Farm Address",
        description="The coordinator's HTTP address, e.g. http://farm:7070, or several separated by "
                    "commas, tried in turn (a scene's own address comes first; empty: "
                    "$TILEFARM_SERVER, else http://127.0.0.1:7070)",
    )
    token: StringProperty(
        name="API Token",
        description="The farm's API token (empty: $TILEFARM_API_TOKEN). Kept in your Blender "
                    "preferences, never in a .blend",
        subtype='PASSWORD',
    )
    coordinator: StringProperty(
        name="coordinator Command",
        description="Path of tilefarm's coordinator program, which submits (empty: "
                    "$TILEFARM_COORDINATOR, else coordinator on PATH)",
        subtype='FILE_PATH',
    )
    blender: StringProperty(
        name="Inspecting Blender",
        description="The Blender that reads the .blend for its files, cameras and settings before "
                    "it is sent (empty: $TILEFARM_BLENDER, else this Blender); the farm renders "
                    "with its own",
        subtype='FILE_PATH',
    )
    submit_timeout: IntProperty(
        name="Submission Timeout",
        description="Seconds a submission (inspecting the .blend, uploading it and its files) may "
                    "take before it is stopped",
        default=600, min=10, max=86400,
    )

    def draw(self, context):
        layout = self.layout
        layout.use_property_split = True
        layout.prop(self, "server")
        layout.prop(self, "token")
        layout.prop(self, "coordinator")
        layout.prop(self, "blender")
        layout.prop(self, "submit_timeout")


def preferences(context=None):
    """The add-on's preferences, or None when it is not enabled."""
    context = context or bpy.context
    addon = context.preferences.addons.get(__package__)
    return addon.preferences if addon else None


def server(tf, context=None):
    """The farm a scene submits to: its own address, else the preferences', else
    $TILEFARM_SERVER, else the command line's default."""
    prefs = preferences(context)
    return farm.normalize_server(tf.server or (prefs.server if prefs else "")
                                 or os.environ.get(farm.ENV_SERVER, "") or farm.DEFAULT_SERVER)


def token(context=None):
    """The API token: the preferences', else $TILEFARM_API_TOKEN."""
    prefs = preferences(context)
    return (prefs.token if prefs else "") or os.environ.get(farm.ENV_TOKEN, "")


UNSPLITTABLE = [
    ('WHOLE', "Render Whole",
     "Frames whose settings cannot be split (adaptive sampling, denoising, a time limit, "
     "Freestyle...) render whole with those settings: Blender's own result"),
    ('SPLIT', "Split Anyway",
     "Split such frames into tiles and passes with those settings switched off (changes the "
     "picture; submit says which)"),
]


class TilefarmSceneSettings(bpy.types.PropertyGroup):
    server: StringProperty(
        name="Farm",
        description="The farm this .blend is submitted to (empty: the add-on's preferences)",
    )
    use_scene_range: BoolProperty(
        name="Scene Frame Range",
        description="Render the scene's frame range and step; off: the range below",
        default=True,
    )
    frame_start: IntProperty(name="Frame Start", description="First frame to render", default=1,
                             min=0)
    frame_end: IntProperty(name="End", description="Last frame to render", default=250, min=0)
    priority: IntProperty(
        name="Priority",
        description="Jobs of higher priority render first (-100 to 100)",
        default=0, min=-100, max=100,
    )
    preview: IntProperty(
        name="Preview Every",
        description="Render first every Nth frame of the range and the last one, then the rest "
                    "(0: in order)",
        default=0, min=0,
    )
    tile_size: IntProperty(
        name="Tile Size",
        description="Tile size in pixels (0: the farm's default, 256); never changes a pixel",
        default=0, min=0, max=4096,
    )
    passes: IntProperty(
        name="Passes",
        description="Passes each tile's samples are split into, each a checkpoint a stopped tile "
                    "resumes from (0: the farm's default, 4)",
        default=0, min=0, max=1024,
    )
    unsplittable: EnumProperty(
        name="Unsplittable Frames",
        description="What the farm does with frames that cannot be split into tiles",
        items=UNSPLITTABLE, default='WHOLE',
    )
    requires: StringProperty(
        name="Required Tags",
        description="Tags a render node must carry to render the job, comma-separated (e.g. "
                    "highmem)",
    )

    # The job submitted last from this scene, and where it stood when last asked.
    job_id: StringProperty(name="Job", description="The job submitted last from this scene")
    job_server: StringProperty(name="Job's Farm", description="The farm the job was submitted to")
    job_state: StringProperty(name="State", description="The job's state when last asked")
    progress: FloatProperty(name="Progress", description="How far the job is",
                            subtype='PERCENTAGE', min=0.0, max=100.0, precision=0)
    job_detail: StringProperty(name="Detail", description="Frames and tiles done, ETA, failures")
    monitor_url: StringProperty(name="Monitor", description="The job in the farm's web monitor",
                                subtype='NONE')


def apply_status(tf, status, server):
    """Keeps a job's status in the scene's settings, for the panel."""
    tf.job_state = str(status.get("state", ""))
    tf.progress = 100.0 * farm.progress(status)
    tf.job_detail = farm.detail(status)
    tf.monitor_url = farm.monitor_url(server, tf.job_id)


classes = (TilefarmPreferences, TilefarmSceneSettings)


def register():
    for c in classes:
        bpy.utils.register_class(c)
    bpy.types.Scene.tilefarm = bpy.props.PointerProperty(type=TilefarmSceneSettings)


def unregister():
    del bpy.types.Scene.tilefarm
    for c in reversed(classes):
        bpy.utils.unregister_class(c)
