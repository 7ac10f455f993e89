# The operators: tilefarm.submit sends the saved .blend to the farm through `coordinator submit`
# (one implementation of bundling and checks: docs/design.md, "Flows": Submit) and
# tilefarm.refresh asks the farm once where the job stands. Every failure, expected or not,
# becomes a Blender report with its reason, never a traceback.

import os
import sys
import threading

import bpy

from . import farm, progress, settings

_submitting = set()  # scenes whose submission is running in the background


def _refusal(context):
    """Why the open file cannot be submitted as it is, or None: the farm renders the .blend on
    disk, so it must be saved, with nothing changed since."""
    if not bpy.data.is_saved or not bpy.data.filepath:
        return "Save the .blend first: the farm renders the saved file"
    if not os.path.isfile(bpy.data.filepath):
        return "%s is no longer on disk: save the .blend again" % bpy.data.filepath
    if farm.unsaved_changes():
        return "The .blend has unsaved changes: save it first, since the farm renders the saved file"
    for image in bpy.data.images:
        if image.is_dirty:
            return "The image %r has unsaved changes: save it (Image > Save) first" % image.name
    return None


def _submission(context):
    """The submission the scene's settings make, and the coordinator command to run it with;
    FarmError when the file or the settings cannot be submitted."""
    reason = _refusal(context)
    if reason:
        raise farm.FarmError(reason)
    prefs = settings.preferences(context)
    # A path the file browser made relative ("//...") is taken as Blender takes it.
    coordinator = farm.find_coordinator(bpy.path.abspath(prefs.coordinator) if prefs else "")
    tf = context.scene.tilefarm
    # The settings are checked where every submission's are: by coordinator submit.
    frames = None if tf.use_scene_range else (tf.frame_start, tf.frame_end)
    # The Blender that inspects the .blend: the preferences', else $TILEFARM_BLENDER (which the
    # command line reads itself), else this very Blender: its executable, or the Python it runs
    # in when it is the bpy module (a build too, README "Blender lines").
    blender = bpy.path.abspath(prefs.blender.strip()) if prefs and prefs.blender.strip() else ""
    if not blender and not os.environ.get(farm.ENV_BLENDER):
        blender = bpy.app.binary_path or sys.executable or ""
    sub = farm.Submission(
        blend=bpy.data.filepath, server=settings.server(tf, context), token=settings.token(context),
        frames=frames, priority=tf.priority, preview=tf.preview, tile=tf.tile_size,
        passes=tf.passes, split=tf.unsplittable == 'SPLIT', requires=tf.requires.split(","),
        blender=blender)
    timeout = prefs.submit_timeout if prefs else 600
    return sub, coordinator, timeout


def _submit_into(outcome, sub, coordinator, timeout):
    """Submits, in a thread of its own, and leaves the answer in outcome["answer"] and the
    upload's latest progress line in outcome["progress"]."""
    def progress(line):
        outcome["progress"] = line
    try:
        outcome["answer"] = (farm.submit(sub, coordinator, timeout, progress), None)
    except Exception as e:
        outcome["answer"] = (None, e)


def _unexpected(e):
    return "tilefarm: unexpected error: %s: %s" % (type(e).__name__, e)


class TILEFARM_OT_submit(bpy.types.Operator):
    """Submit the saved .blend to the render farm, with the settings of the tilefarm panel"""

    bl_idname = "tilefarm.submit"
    bl_label = "Submit to Farm"
    # No UNDO: a submission changes nothing of the scene that an undo should take back, and an
    # undo step would mark the file changed, which the next submission refuses.
    bl_options = {'REGISTER'}

    @classmethod
    def poll(cls, context):
        return context.scene is not None and context.scene.name not in _submitting

    def execute(self, context):
        """Submits and waits for the answer (scripts, headless Blender)."""
        try:
            sub, coordinator, timeout = _submission(context)
            submitted = farm.submit(sub, coordinator, timeout)
            return self._accepted(context.scene, sub, submitted)
        except farm.FarmError as e:
            self.report({'ERROR'}, str(e))
        except Exception as e:
            self.report({'ERROR'}, _unexpected(e))
        return {'CANCELLED'}

    def invoke(self, context, event):
        """The panel's button: the submission runs in a thread, so Blender stays responsive
        while the .blend is inspected and uploaded, and its answer is reported when it comes."""
        if bpy.app.background:
            return self.execute(context)
        try:
            sub, coordinator, timeout = _submission(context)
        except farm.FarmError as e:
            self.report({'ERROR'}, str(e))
            return {'CANCELLED'}
        except Exception as e:
            self.report({'ERROR'}, _unexpected(e))
            return {'CANCELLED'}
        self._scene = context.scene.name
        self._sub = sub
        self._outcome = {}  # the thread's answer; the thread touches nothing of Blender's
        self._thread = threading.Thread(target=_submit_into,
                                        args=(self._outcome, sub, coordinator, timeout),
                                        name="tilefarm submit", daemon=True)
        _submitting.add(self._scene)
        self._thread.start()
        wm = context.window_manager
        self._timer = wm.event_timer_add(0.25, window=context.window)
        wm.modal_handler_add(self)
        self.report({'INFO'}, "Submitting %s to %s" % (os.path.basename(sub.blend), sub.server))
        return {'RUNNING_MODAL'}

    def modal(self, context, event):
        if event.type != 'TIMER':
            return {'PASS_THROUGH'}
        if self._thread.is_alive():
            line = self._outcome.get("progress")
            if line and context.workspace is not None:
                context.workspace.status_text_set("tilefarm: " + line)
            return {'PASS_THROUGH'}
        if context.workspace is not None:
            context.workspace.status_text_set(None)
        context.window_manager.event_timer_remove(self._timer)
        _submitting.discard(self._scene)
        submitted, err = self._outcome.get("answer") or (
            None, farm.FarmError("The submission ended without an answer"))
        scene = bpy.data.scenes.get(self._scene)
        if err is None and scene is None:
            err = farm.FarmError("The scene %r is gone; job %s was submitted"
                                 % (self._scene, submitted.status.get("job_id")))
        if err is not None:
            self.report({'ERROR'}, str(err) if isinstance(err, farm.FarmError) else _unexpected(err))
            return {'CANCELLED'}
        try:
            return self._accepted(scene, self._sub, submitted)
        except Exception as e:
            self.report({'ERROR'}, _unexpected(e))
            return {'CANCELLED'}

    def cancel(self, context):
        # Blender ends the operator (a file loaded, Blender quitting); the command finishes on its own.
        _submitting.discard(getattr(self, "_scene", ""))

    def _accepted(self, scene, sub, submitted):
        st = submitted.status
        tf = scene.tilefarm
        tf.job_id = st["job_id"]
        tf.job_server = sub.server
        settings.apply_status(tf, st, sub.server)
        for note in submitted.notes:
            self.report({'INFO'}, note)
        if st.get("build"):
            self.report({'INFO'}, "The farm renders it with %s" % farm.build_name(st["build"]))
        state = tf.job_state
        if state in ("failed", "cancelled"):
            # The same request returns the same job (docs/design.md, "Identities": job_id).
            self.report({'ERROR'}, "Job %s is %s: %s" % (tf.job_id, state, tf.job_detail))
            return {'CANCELLED'}
        self.report({'INFO'}, "Submitted job %s: %s, %s" % (tf.job_id, state, tf.job_detail))
        progress.watch(scene)
        progress.redraw()
        return {'FINISHED'}


class TILEFARM_OT_refresh(bpy.types.Operator):
    """Ask the farm where the scene's job stands"""

    bl_idname = "tilefarm.refresh"
    bl_label = "Refresh"
    bl_options = {'REGISTER'}

    @classmethod
    def poll(cls, context):
        return context.scene is not None and bool(context.scene.tilefarm.job_id)

    def execute(self, context):
        tf = context.scene.tilefarm
        try:
            if not tf.job_id:
                raise farm.FarmError("No job was submitted from this scene")
            server = tf.job_server or settings.server(tf, context)
            # Shorter than the background requests': the user interface waits for this one.
            status, answered = farm.fetch_status(server, settings.token(context), tf.job_id, 5.0)
            settings.apply_status(tf, status, answered)
        except farm.FarmError as e:
            self.report({'ERROR'}, str(e))
            return {'CANCELLED'}
        except Exception as e:
            self.report({'ERROR'}, _unexpected(e))
            return {'CANCELLED'}
        self.report({'INFO'}, "Job %s: %s, %d%%, %s" % (tf.job_id, tf.job_state, round(tf.progress), tf.job_detail))
        if tf.job_state not in farm.FINISHED_STATES:
            progress.watch(context.scene)
        return {'FINISHED'}


classes = (TILEFARM_OT_submit, TILEFARM_OT_refresh)


def submitting(scene):
    """Whether a submission of scene is running in the background."""
    return scene.name in _submitting


@bpy.app.handlers.persistent
def _on_load(_dummy=None):
    # Loading a file ends the modal submissions; their commands finish on their own.
    _submitting.clear()


def register():
    for c in classes:
        bpy.utils.register_class(c)
    bpy.app.handlers.load_post.append(_on_load)


def unregister():
    if _on_load in bpy.app.handlers.load_post:
        bpy.app.handlers.load_post.remove(_on_load)
    _submitting.clear()
    for c in reversed(classes):
        bpy.utils.unregister_class(c)
