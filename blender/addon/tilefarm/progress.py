# Following a job while Blender runs: a bpy.app.timers function asks the farm's HTTP API for the
# status of each scene's unfinished job, in a thread so a slow or unreachable farm never freezes
# Blender, and keeps the answer in scene.tilefarm for the panel. Headless Blender runs no timers:
# there the tilefarm.refresh operator asks once.

import threading
import time

import bpy

from . import farm, settings

TICK = 0.5  # seconds between looks at the requests in flight
EVERY = 2.0  # seconds between requests for one job
MOST = 30.0  # the longest wait between requests while the farm cannot be reached
TIMEOUT = 10.0  # seconds one request may take

_watched = {}  # scene name -> _Watch


class _Watch:
    def __init__(self):
        self.thread = None
        self.job_id = ""
        self.result = None  # (status, None) or (None, FarmError)
        self.due = 0.0
        self.wait = EVERY


def watch(scene):
    """Follows scene's job until it is finished, when Blender has a user interface."""
    if bpy.app.background or not scene.tilefarm.job_id:
        return
    _watched.setdefault(scene.name, _Watch())
    if not bpy.app.timers.is_registered(_tick):
        bpy.app.timers.register(_tick, first_interval=TICK)


def stop():
    _watched.clear()
    for f in (_tick, _follow_open_file):
        if bpy.app.timers.is_registered(f):
            bpy.app.timers.unregister(f)


def _fetch(w, server, token, job_id):
    try:
        w.result = (farm.fetch_status(server, token, job_id, TIMEOUT), None)  # (status, address)
    except farm.FarmError as e:
        w.result = (None, e)
    except Exception as e:  # never let a thread die with a traceback on the console
        w.result = (None, farm.FarmError("Asking the farm failed: %s: %s" % (type(e).__name__, e)))


def _tick():
    try:
        changed = _poll()
        if changed:
            redraw()
    except Exception:
        # A timer that raises is unregistered with a traceback on the console; drop the jobs
        # followed instead: Refresh in the panel asks again.
        _watched.clear()
        return None
    return TICK if _watched else None


def _poll():
    changed = False
    now = time.monotonic()
    for name, w in list(_watched.items()):
        scene = bpy.data.scenes.get(name)
        if scene is None or not scene.tilefarm.job_id:
            del _watched[name]
            continue
        tf = scene.tilefarm
        if w.thread is not None:
            if w.thread.is_alive():
                continue
            w.thread = None
            answer, err = w.result
            if w.job_id != tf.job_id:
                continue  # an answer about a job submitted before this one
            changed = True
            if err is not None:
                tf.job_detail = "Cannot follow the job: %s" % err
                w.wait = min(MOST, w.wait * 2)
            else:
                status, answered = answer
                settings.apply_status(tf, status, answered)
                w.wait = EVERY
                if tf.job_state in farm.FINISHED_STATES:
                    del _watched[name]
                    continue
            w.due = now + w.wait
        elif now >= w.due:
            w.job_id = tf.job_id
            server = tf.job_server or settings.server(tf)
            w.thread = threading.Thread(target=_fetch, args=(w, server, settings.token(), w.job_id),
                                        name="tilefarm status", daemon=True)
            w.thread.start()
    return changed


def redraw():
    wm = bpy.context.window_manager
    for window in wm.windows if wm else ():
        for area in window.screen.areas:
            if area.type == 'PROPERTIES':
                area.tag_redraw()


@bpy.app.handlers.persistent
def _on_load(_dummy=None):
    """Follows again the unfinished jobs of a .blend just opened."""
    for scene in bpy.data.scenes:
        tf = scene.tilefarm
        if tf.job_id and tf.job_state not in farm.FINISHED_STATES:
            watch(scene)


def _follow_open_file():
    try:
        _on_load()
    except Exception:
        pass  # nothing to follow, or no file yet: the next file opened is looked at
    return None


def register():
    bpy.app.handlers.load_post.append(_on_load)
    if not bpy.app.background:
        # Enabled with a .blend already open: follow its jobs once Blender lets data be read.
        bpy.app.timers.register(_follow_open_file, first_interval=1.0)


def unregister():
    if _on_load in bpy.app.handlers.load_post:
        bpy.app.handlers.load_post.remove(_on_load)
    stop()
