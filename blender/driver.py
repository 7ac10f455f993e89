# tilefarm's driver of one persistent Blender process (docs/design.md, "Blender scenes").
#
# Blender runs it as: blender -b --factory-startup --disable-autoexec -t 1 --python driver.py
#                     -- REQUEST_FD REPLY_FD
# Requests arrive one JSON object per line on REQUEST_FD; every request gets exactly one JSON
# reply line on REPLY_FD ({"ok": true, ...} or {"ok": false, "error": ..., "scene_error": bool}), and
# every second the driver writes {"alive": true}, so the worker can tell a long render from a
# frozen process. stdout and stderr carry only Blender's own logs.
#
# "scene_error": true marks an error of the scene or the request (no such camera, a missing file):
# the same request can never succeed. Anything else is the process's trouble.
import json
import os
import re
import struct
import sys
import threading
import time

import bpy

try:
    import _cycles
except ImportError:  # a Blender built without Cycles
    _cycles = None

req_fd, rep_fd = (int(a) for a in sys.argv[sys.argv.index("--") + 1:][:2])
requests = os.fdopen(req_fd, "r", encoding="utf-8")
replies = os.fdopen(rep_fd, "w", encoding="utf-8")


class SceneError(Exception):
    """The scene or the request is wrong: no retry can fix it."""


send_lock = threading.Lock()


def send(obj):
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with send_lock:
        replies.write(line)
        replies.flush()


# --- build identity -------------------------------------------------------------------------

def cpu_flags():
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def build():
    """What decides Cycles' bits on this machine: Blender's build, the CPU kernel, the BVH."""
    cy = bpy.context.scene.cycles
    flags = cpu_flags()
    kernel = "sse2"
    for name, flag, enabled in (("avx2", "avx2", cy.debug_use_cpu_avx2), ("avx", "avx", cy.debug_use_cpu_avx),
                                ("sse41", "sse4_1", cy.debug_use_cpu_sse41)):
        if flag in flags and enabled:
            kernel = name
            break
    bvh = "embree" if _cycles is not None and _cycles.with_embree and cy.debug_bvh_layout == "EMBREE" else "bvh2"
    hash_ = bpy.app.build_hash.decode("ascii", "replace") if isinstance(bpy.app.build_hash, bytes) else str(bpy.app.build_hash)
    return {"version": bpy.app.version_string, "hash": hash_, "kernel": kernel, "bvh": bvh,
            "cycles": _cycles is not None}


# --- opening scenes --------------------------------------------------------------------------

current = {"file": None}


def open_file(path, split=True):
    """Opens path unless it is open already, prepared for renders (split_only) unless split is
    false."""
    if current["file"] == path:
        return
    current["file"] = None
    if not os.path.isfile(path):
        raise SceneError("no such file: %s" % path)
    try:
        bpy.ops.wm.open_mainfile(filepath=path, load_ui=False, use_scripts=False)
    except RuntimeError as e:
        raise SceneError("opening %s: %s" % (os.path.basename(path), str(e).strip()))
    if split:
        split_only(bpy.context.scene)
        current["file"] = path


def scene_cameras(sc):
    return sorted(o.name for o in sc.objects if o.type == "CAMERA")


# --- inspect: what a submission needs to know, and what stops it -----------------------------

SEQ_DIGITS = re.compile(r"^(.*?)(\d+)(\.[^.]*)$")


def expand(path, datablock):
    """Every file behind one dependency: a directory's files, UDIM tiles, image sequences."""
    if os.path.isdir(path):
        out = []
        for root, _, files in os.walk(path):
            out += [os.path.join(root, f) for f in sorted(files)]
        return out
    if "<UDIM>" in path or "<UVTILE>" in path:
        d, base = os.path.split(path)
        pat = re.compile("^" + re.escape(base).replace(re.escape("<UDIM>"), r"\d{4}").replace(re.escape("<UVTILE>"), r"u\d+_v\d+") + "$")
        names = sorted(os.listdir(d)) if os.path.isdir(d) else []
        return [os.path.join(d, f) for f in names if pat.match(f)]
    if datablock is not None and getattr(datablock, "source", "") == "SEQUENCE":
        d, base = os.path.split(path)
        m = SEQ_DIGITS.match(base)
        if m and os.path.isdir(d):
            head, digits, tail = m.groups()
            pat = re.compile("^" + re.escape(head) + r"\d{%d,}" % len(digits) + re.escape(tail) + "$")
            return [os.path.join(d, f) for f in sorted(os.listdir(d)) if pat.match(f)]
    return [path]


def owners():
    """Maps absolute paths to the datablock that names them, for clear errors."""
    out = {}
    for kind, coll in (("image", bpy.data.images), ("linked library", bpy.data.libraries),
                       ("sound", bpy.data.sounds), ("font", bpy.data.fonts), ("movie clip", bpy.data.movieclips),
                       ("volume", bpy.data.volumes), ("cache file", bpy.data.cache_files)):
        for db in coll:
            fp = getattr(db, "filepath", "")
            if not fp or getattr(db, "packed_file", None) is not None:
                continue
            lib = getattr(db, "library", None)
            full = bpy.path.abspath(fp, library=lib) if lib is not None else bpy.path.abspath(fp)
            out[os.path.normpath(full)] = (kind, db)
    return out


def switched_off(sc):
    """The scene's settings that cannot be split by tile or sample range, as one line each."""
    cy, r = sc.cycles, sc.render
    out = []
    if cy.use_adaptive_sampling:
        out.append("adaptive sampling (noise threshold %g) is off: every pixel renders all %d samples" % (cy.adaptive_threshold, cy.samples))
    if cy.use_denoising:
        out.append("denoising (%s) is off: it needs the whole frame" % cy.denoiser)
    if r.use_compositing and sc.use_nodes:
        out.append("compositing is off: it needs the whole frame")
    if r.use_sequencer and sc.sequence_editor is not None and len(sc.sequence_editor.sequences_all) > 0:
        out.append("the sequencer is off: tilefarm renders the 3D scene")
    if getattr(cy, "use_guiding", False):
        out.append("path guiding is off: it learns across samples")
    if cy.use_animated_seed:
        out.append("the animated seed is off: every frame uses seed %d" % cy.seed)
    if cy.time_limit > 0:
        out.append("the time limit (%gs) is off: every tile renders all its samples" % cy.time_limit)
    if cy.use_layer_samples == "USE" and any(vl.samples > 0 for vl in sc.view_layers):
        out.append("view layer sample counts are ignored: every layer renders %d samples" % cy.samples)
    if r.use_freestyle:
        out.append("Freestyle is off: its lines need the whole frame")
    layers = [vl.name for vl in sc.view_layers if vl.use]
    if len(layers) > 1:
        out.append("only the view layer %r is rendered (of %d)" % (bpy.context.view_layer.name, len(layers)))
    if r.film_transparent:
        out.append("the transparent film's alpha is not kept: frames are RGB")
    if cy.device != "CPU":
        out.append("the GPU device is not used: tiles render on CPU, one thread per process")
    return out


def inspect(req):
    open_file(req["file"], split=False)  # the scene's own settings; a render opens it afresh
    sc = bpy.context.scene
    frame = sc.frame_start
    sc.frame_set(frame)  # evaluates drivers, so a Python driver blocked by autoexec shows below
    if bpy.app.autoexec_fail:
        raise SceneError("the scene needs Python scripts to run (%s), which tilefarm never runs: "
                         "remove them or bake their effect into the scene" % (bpy.app.autoexec_fail_message or "blocked auto-run script"))
    if sc.render.engine != "CYCLES":
        raise SceneError("the scene renders with %s; tilefarm renders Cycles scenes (set Render Engine to Cycles)" % sc.render.engine)
    cams = scene_cameras(sc)
    if not cams:
        raise SceneError("the scene %r has no camera" % sc.name)
    stored = bpy.utils.blend_paths(absolute=False, packed=False, local=False)
    absolute = bpy.utils.blend_paths(absolute=True, packed=False, local=False)
    who = owners()
    deps, missing, abs_refs = [], [], []
    for raw, full in zip(stored, absolute):
        if raw.startswith("<") or raw == "":
            continue  # <builtin> fonts and the like live in Blender itself
        full = os.path.normpath(full)
        kind, db = who.get(full, ("file", None))
        label = "%s %r" % (kind, db.name) if db is not None else kind
        if not raw.startswith("//"):
            abs_refs.append("%s uses the absolute path %s" % (label, raw))
            continue
        files = expand(full, db)
        if not files or not all(os.path.exists(f) for f in files):
            missing.append("%s needs %s, which is missing" % (label, raw))
            continue
        deps += files
    if abs_refs:
        raise SceneError("; ".join(abs_refs) + ": make paths relative (File > External Data > Make Paths Relative) so the farm can find them")
    if missing:
        raise SceneError("; ".join(missing))
    r, cy = sc.render, sc.cycles
    return {"scene": sc.name, "deps": sorted(set(deps)),
            "cameras": cams, "camera": sc.camera.name if sc.camera is not None and sc.camera.type == "CAMERA" else "",
            "width": r.resolution_x * r.resolution_percentage // 100,
            "height": r.resolution_y * r.resolution_percentage // 100,
            "spp": cy.samples, "seed": cy.seed, "max_bounces": cy.max_bounces,
            "frame_start": sc.frame_start, "frame_end": sc.frame_end,
            "view_transform": sc.view_settings.view_transform, "look": sc.view_settings.look,
            "exposure": sc.view_settings.exposure, "gamma": sc.view_settings.gamma,
            "switched_off": switched_off(sc)}


# --- render: one pass of one tile -------------------------------------------------------------

def edge(p, n):
    """The border float Blender turns back into exactly pixel p of n: int(float32(f) * n) == p."""
    if p == 0:
        return 0.0
    if p == n:
        return 1.0
    return (p + 0.5) / n


def split_only(sc):
    """Switches off what cannot be split by tile or sample range; everything else is the scene's."""
    cy, r = sc.cycles, sc.render
    cy.device = "CPU"
    cy.use_adaptive_sampling = False
    cy.use_denoising = False
    if hasattr(cy, "use_guiding"):
        cy.use_guiding = False
    cy.use_animated_seed = False
    cy.time_limit = 0
    cy.use_layer_samples = "IGNORE"
    r.use_compositing = False
    r.use_sequencer = False
    r.use_freestyle = False
    r.use_single_layer = True
    r.threads_mode = "FIXED"
    r.threads = 1
    # Keeps the synced scene and its BVH between the passes a process renders; a pass's bits
    # do not depend on what the process rendered before (tested).
    r.use_persistent_data = True
    r.use_border, r.use_crop_to_border = True, True
    r.resolution_percentage = 100
    r.use_file_extension = False
    s = r.image_settings
    s.file_format = "OPEN_EXR"
    s.color_mode = "RGBA"
    s.color_depth = "32"
    s.exr_codec = "NONE"


def heartbeat():
    # Cycles reports no progress in background mode until a render ends, but Blender releases
    # the GIL while it renders: a beat every second tells the worker the process is not frozen.
    while True:
        time.sleep(1)
        send({"alive": True})


def f32(v):
    """v as Blender stores a float property."""
    return struct.unpack("f", struct.pack("f", v))[0]


def put(obj, attr, value):
    # Setting a property tags the scene for an update even to the value it has, which would
    # make Cycles sync the scene again; only what changes is set.
    if getattr(obj, attr) != value:
        setattr(obj, attr, value)


def render(req):
    open_file(req["file"])
    sc = bpy.context.scene
    if sc.frame_current != req["frame"]:
        sc.frame_set(req["frame"])
    cam = sc.objects.get(req["camera"])
    if cam is None or cam.type != "CAMERA":
        raise SceneError("the scene has no camera %r (have %s)" % (req["camera"], ", ".join(scene_cameras(sc)) or "none"))
    if sc.camera != cam:
        sc.camera = cam
    r, cy = sc.render, sc.cycles
    w, h = req["width"], req["height"]
    x0, y0, x1, y1 = req["rect"]
    if not (0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h):
        raise SceneError("rect %s is outside the %dx%d frame" % (req["rect"], w, h))
    put(r, "resolution_x", w)
    put(r, "resolution_y", h)
    # Blender's y runs from the bottom.
    for attr, value in (("border_min_x", edge(x0, w)), ("border_max_x", edge(x1, w)),
                        ("border_min_y", edge(h - y1, h)), ("border_max_y", edge(h - y0, h))):
        put(r, attr, f32(value))
    put(cy, "seed", req["seed"])
    put(cy, "sample_offset", req["from"])
    put(cy, "samples", req["to"] - req["from"])
    out = req["out"]
    if os.path.exists(out):
        os.remove(out)
    r.filepath = out
    start = time.perf_counter()
    bpy.ops.render.render(write_still=True)
    seconds = time.perf_counter() - start
    if not os.path.isfile(out):
        raise RuntimeError("Blender wrote no image to %s" % out)
    return {"render_seconds": seconds}


# --- encode: the assembled float frame as Blender itself would write it -----------------------

def encode(req):
    """Writes the float frame through Blender's own render pipeline: a compositor-only render
    (an Image node into the Composite output, no Render Layers, so no 3D render) applies the
    scene's colour management and dither exactly as a render of the scene would. It renders a
    copy of the scene, so the scene itself stays as the passes it renders need it."""
    open_file(req["file"])
    img = bpy.data.images.load(req["in"], check_existing=False)
    enc = bpy.context.scene.copy()
    try:
        img.colorspace_settings.name = "Linear"
        w, h = img.size
        enc.use_nodes = True
        tree = enc.node_tree
        for n in list(tree.nodes):
            tree.nodes.remove(n)
        src = tree.nodes.new("CompositorNodeImage")
        src.image = img
        dst = tree.nodes.new("CompositorNodeComposite")
        tree.links.new(src.outputs["Image"], dst.inputs["Image"])
        r = enc.render
        r.use_compositing, r.use_sequencer, r.use_border = True, False, False
        r.resolution_x, r.resolution_y, r.resolution_percentage = w, h, 100
        s = r.image_settings
        s.file_format = "PNG"
        s.color_mode = "RGB"
        s.color_depth = req["depth"]
        s.compression = 15
        out = req["out"]
        if os.path.exists(out):
            os.remove(out)
        r.filepath = out
        bpy.ops.render.render(write_still=True, scene=enc.name)
    finally:
        bpy.data.scenes.remove(enc)
        bpy.data.images.remove(img)
    if not os.path.isfile(out):
        raise RuntimeError("Blender wrote no image to %s" % out)
    return {}


OPS = {"inspect": inspect, "render": render, "encode": encode}


def main():
    send({"ok": True, "build": build()})
    threading.Thread(target=heartbeat, daemon=True).start()
    for line in requests:
        try:
            req = json.loads(line)
            op = OPS.get(req.get("op"))
            if op is None:
                raise SceneError("unknown request %r" % req.get("op"))
            reply = op(req)
            reply["ok"] = True
            send(reply)
        except SceneError as e:
            send({"ok": False, "scene_error": True, "error": str(e)})
        except Exception as e:  # the process's trouble: reported, and the worker decides
            send({"ok": False, "error": "%s: %s" % (type(e).__name__, e)})
    # The worker closed the requests pipe (or died): nothing more to do.


main()
os._exit(0)
