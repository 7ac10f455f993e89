# Drives tilefarm's Blender add-on in a headless Blender for the e2e tests (addon_test.go), as an
# artist would from the panel: it runs the steps of a JSON plan and prints one line per step,
# "TILEFARM_STEP {json}", which the test reads.
#
#   blender -b --factory-startup --python addon_steps.py -- PLAN.json
#
# A step is an object with one of:
#   "install": ZIP       install the add-on from its zip and enable it
#   "prefs": {...}       set the add-on's preferences
#   "open": BLEND        open a .blend;  "new": true  a new, never saved file
#   "set": {...}         set scene.tilefarm's properties (the panel's)
#   "dirty": true        change the open file without saving it (an undo step, as an edit makes)
#   "save": true         save the open file where it is (headless Blender writes the file's
#                        unsaved-changes mark as it stands: only the user interface's event loop
#                        clears it on saving or opening, so save only an unchanged file here)
#   "op": NAME           run bpy.ops.tilefarm.NAME(): its result, or the error it reported
#   "wait": SECONDS      run tilefarm.refresh every half second until the job is finished
#   "follow": SECONDS    follow the job as the user interface does, until it is finished:
#                        headless Blender runs no timers, so this calls the add-on's timer
#                        function (tilefarm.progress) by hand
#   "draw": true         draw the tilefarm panel into a layout that records what it shows and
#                        checks that every property and operator it names exists
# Each line holds the step's name, "error" (the text of an ERROR report, which bpy.ops raises
# as RuntimeError), "result" and "props" (scene.tilefarm after the step).

import json
import sys
import time

import bpy

PROPS = ("server", "use_scene_range", "frame_start", "frame_end", "priority", "preview", "tile_size",
         "passes", "unsplittable", "requires", "job_id", "job_server", "job_state", "progress",
         "job_detail", "monitor_url")


def emit(step, **kw):
    kw["step"] = step
    tf = getattr(bpy.context.scene, "tilefarm", None)
    if tf is not None:
        kw["props"] = {p: getattr(tf, p) for p in PROPS}
    kw["saved"], kw["dirty"] = bpy.data.is_saved, bpy.data.is_dirty
    print("TILEFARM_STEP " + json.dumps(kw), flush=True)


def op(name):
    try:
        return sorted(getattr(bpy.ops.tilefarm, name)()), ""
    except RuntimeError as e:  # an ERROR report
        return ["CANCELLED"], str(e).strip()


class Layout:
    """Records what a panel draws: its labels and its progress text, every property and operator
    checked against what is registered."""

    def __init__(self, out):
        self.out = out
        self.use_property_split = self.use_property_decorate = False
        self.active = self.enabled = True
        self.scale_y = 1.0

    def column(self, **kw):
        return Layout(self.out)

    row = box = column

    def prop(self, data, name, **kw):
        if name not in data.bl_rna.properties:
            raise AssertionError("the panel draws %s, which %s does not have" % (name, data))
        self.out.append("prop:" + name)

    def label(self, text="", **kw):
        self.out.append("label:" + text)

    def progress(self, text="", **kw):  # Blender 4.0 and later
        self.out.append("label:" + text)

    def operator(self, idname, text="", **kw):
        group, name = idname.split(".")
        getattr(getattr(bpy.ops, group), name).get_rna_type()  # raises KeyError if unknown
        self.out.append("operator:" + idname)
        return type("OperatorProperties", (), {})()


def draw():
    import tilefarm.panel
    out = []
    panel = tilefarm.panel.TILEFARM_PT_farm
    panel.draw(type("Panel", (), {"layout": Layout(out)})(), bpy.context)
    return out


def main():
    plan = json.load(open(sys.argv[sys.argv.index("--") + 1]))
    for s in plan:
        if "install" in s:
            r1 = bpy.ops.preferences.addon_install(filepath=s["install"])
            r2 = bpy.ops.preferences.addon_enable(module="tilefarm")
            emit("install", result=sorted(r1 | r2))
        elif "prefs" in s:
            prefs = bpy.context.preferences.addons["tilefarm"].preferences
            for k, v in s["prefs"].items():
                setattr(prefs, k, v)
            emit("prefs")
        elif "open" in s:
            bpy.ops.wm.open_mainfile(filepath=s["open"])
            emit("open")
        elif "new" in s:
            bpy.ops.wm.read_homefile(app_template="")
            emit("new")
        elif "set" in s:
            tf = bpy.context.scene.tilefarm
            for k, v in s["set"].items():
                setattr(tf, k, v)
            emit("set")
        elif "dirty" in s:
            bpy.context.scene.frame_current = bpy.context.scene.frame_current + 1
            bpy.ops.ed.undo_push(message="an edit")
            emit("dirty")
        elif "save" in s:
            bpy.ops.wm.save_mainfile()
            emit("save")
        elif "op" in s:
            result, error = op(s["op"])
            emit(s["op"], result=result, error=error)
        elif "wait" in s:
            deadline = time.monotonic() + s["wait"]
            result, error = op("refresh")
            while not error and bpy.context.scene.tilefarm.job_state not in ("completed", "failed", "cancelled") \
                    and time.monotonic() < deadline:
                time.sleep(0.5)
                result, error = op("refresh")
            emit("wait", result=result, error=error)
        elif "follow" in s:
            import tilefarm.progress as progress
            name = bpy.context.scene.name
            progress._watched[name] = progress._Watch()
            deadline = time.monotonic() + s["follow"]
            while name in progress._watched and time.monotonic() < deadline:
                if progress._tick() is None:
                    break
                time.sleep(progress.TICK)
            emit("follow", result=["RUNNING_MODAL"] if name in progress._watched else ["FINISHED"])
        elif "draw" in s:
            emit("draw", result=draw())
        else:
            raise SystemExit("unknown step %r" % s)


main()
