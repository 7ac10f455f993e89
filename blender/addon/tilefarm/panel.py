# The tilefarm panel in Render Properties: where the .blend goes and how it renders, the Submit
# button, and the job submitted last with its progress and its page in the web monitor.

import bpy

from . import farm, operators, settings


class TILEFARM_PT_farm(bpy.types.Panel):
    bl_label = "tilefarm"
    bl_space_type = 'PROPERTIES'
    bl_region_type = 'WINDOW'
    bl_context = "render"

    def draw(self, context):
        layout = self.layout
        layout.use_property_split = True
        layout.use_property_decorate = False
        tf = context.scene.tilefarm

        col = layout.column()
        col.prop(tf, "server")
        if not tf.server:
            col.label(text="Farm: %s" % settings.server(tf, context))
        col.prop(tf, "use_scene_range")
        sub = col.column(align=True)
        sub.active = not tf.use_scene_range
        sub.prop(tf, "frame_start")
        sub.prop(tf, "frame_end")
        col.prop(tf, "priority")
        col.prop(tf, "preview")
        col.prop(tf, "tile_size")
        col.prop(tf, "passes")
        col.prop(tf, "unsplittable")
        col.prop(tf, "requires")

        row = layout.row()
        row.scale_y = 1.5
        busy = operators.submitting(context.scene)
        row.operator("tilefarm.submit", text="Submitting..." if busy else "Submit to Farm",
                     icon='RENDER_ANIMATION')
        if not bpy.data.is_saved:
            layout.label(text="Save the .blend to submit it", icon='INFO')
        elif farm.unsaved_changes():
            layout.label(text="Unsaved changes: save to submit them", icon='INFO')

        if not tf.job_id:
            return
        box = layout.box()
        box.use_property_split = False
        box.label(text="Job %s" % tf.job_id)
        text = "%s, %d%%" % (tf.job_state or "unknown", round(tf.progress))
        if hasattr(box, "progress"):  # Blender 4.0 and later
            box.progress(factor=tf.progress / 100.0, type='BAR', text=text)
        else:
            box.label(text=text, icon=_icon(tf.job_state))
        if tf.job_detail:
            box.label(text=tf.job_detail)
        row = box.row()
        row.operator("tilefarm.refresh", icon='FILE_REFRESH')
        if tf.monitor_url:
            row.operator("wm.url_open", text="Open in Monitor", icon='URL').url = tf.monitor_url


def _icon(state):
    if state == "completed":
        return 'CHECKMARK'
    if state in farm.FINISHED_STATES:
        return 'ERROR'
    return 'TIME'


classes = (TILEFARM_PT_farm,)


def register():
    for c in classes:
        bpy.utils.register_class(c)


def unregister():
    for c in reversed(classes):
        bpy.utils.unregister_class(c)
