# tilefarm's driver of one persistent Blender process (docs/design.md, "Blender scenes").
#
# Blender runs it as: blender -b --factory-startup --disable-autoexec --python-exit-code 70
#                     --python driver.py -- REQUEST_FD REPLY_FD N  (a Python with bpy: python
# driver.py -- ...); on Windows the two pipes are inherited handles, given as "h" and the
# handle's number. N is the render threads of a request that names none (a slot's own).
# Requests arrive one JSON object per line on REQUEST_FD; every request gets exactly one JSON
# reply line on REPLY_FD ({"ok": true, ...} or {"ok": false, "error": ..., "scene_error": bool}), and
# every second the driver writes {"alive": true}, so the worker can tell a long render from a
# frozen process. stdout and stderr carry Blender's own logs, and one line of the driver's for
# each pass it renders ("tilefarm: rendered samples A-B of tile X0,Y0-X1,Y1 of frame F with N
# threads"), which
# every line prints alike (5.0 prints no progress of its own in the background).
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
import warnings

ARGS = sys.argv[sys.argv.index("--") + 1:]


def pipe_fd(arg, flags):
    """The fd of a pipe the worker handed down: a number is an fd (Linux, macOS); "h" and a
    number is a Windows handle the process inherited, opened as an fd."""
    if arg.startswith("h"):
        import msvcrt
        handle = int(arg[1:])
        os.set_handle_inheritable(handle, False)  # a process Blender starts must not hold it open
        return msvcrt.open_osfhandle(handle, flags)
    return int(arg)


req_fd, rep_fd = pipe_fd(ARGS[0], os.O_RDONLY), pipe_fd(ARGS[1], os.O_WRONLY)
THREADS = int(ARGS[2]) if len(ARGS) > 2 else 1  # render threads of every render
requests = os.fdopen(req_fd, "r", encoding="utf-8")
replies = os.fdopen(rep_fd, "w", encoding="utf-8")

try:
    import bpy
except ImportError as e:  # a Python that is not a Blender build
    replies.write(json.dumps({"ok": False, "no_bpy": True,
                              "error": "%s cannot import bpy (%s): install Blender's bpy module for it" % (sys.executable, e)}) + "\n")
    replies.flush()
    os._exit(0)

try:
    import _cycles
except ImportError:  # a Blender built without Cycles
    _cycles = None


class SceneError(Exception):
    """The scene or the request is wrong: no retry can fix it."""


send_lock = threading.Lock()


def send(obj):
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with send_lock:
        replies.write(line)
        replies.flush()


# 5.0 warns of what 6.0 removes (Material.use_nodes...) on stderr, which error messages quote.
warnings.filterwarnings("ignore", category=DeprecationWarning)


# --- what differs between the Blender lines the farm runs (3.4, 4.2, 4.5, 5.0), in one place ---

# A Python that imports bpy (Blender as a module) runs the driver as a plain script, without the
# flags the worker gives Blender's executable: it starts from factory settings and with
# auto-run scripts off itself. Render threads are set per request (render), as for the executable.
MODULE = not bpy.app.binary_path


def module_mode():
    if MODULE:
        bpy.ops.wm.read_factory_settings(use_empty=False)  # blender --factory-startup
        bpy.context.preferences.filepaths.use_scripts_auto_execute = False  # --disable-autoexec


def compositor(sc):
    """The compositor's node tree of the scene, None if it has none in use. 5.0 made it a node
    group of its own (scene.compositing_node_group); before, it is the scene's node_tree, used
    when use_nodes is on."""
    if hasattr(sc, "compositing_node_group"):
        return sc.compositing_node_group
    return sc.node_tree if sc.use_nodes else None


def file_output_dir(node):
    """The directory a File Output node writes under: 5.0's directory, base_path before."""
    return node.directory if hasattr(node, "directory") else node.base_path


def set_file_output_dir(node, path):
    if hasattr(node, "directory"):
        node.directory = path
    else:
        node.base_path = path


def set_samples(cy, start, end, total):
    """Renders samples [start, end) of a render of total samples. 4.5 and 5.0 render a subset
    of a render's samples (use_sample_subset), so the sampling pattern is the whole render's;
    3.4 and 4.2 only start at an offset, rendering end-start samples as a render of that many,
    which is the whole render's samples only for patterns that do not depend on the sample
    count (count_dependent_pattern)."""
    if hasattr(cy, "use_sample_subset"):
        put(cy, "use_sample_subset", True)
        put(cy, "samples", total)
        put(cy, "sample_offset", start)
        put(cy, "sample_subset_length", end - start)
    else:
        put(cy, "sample_offset", start)
        put(cy, "samples", end - start)


def count_dependent_pattern(cy):
    """Why a tile's samples cannot be split into passes on this line, or "". 4.2's automatic and
    blue-noise patterns are made for the render's sample count, and 4.2 cannot render a subset
    of a render's samples (4.5 can: set_samples)."""
    if hasattr(cy, "use_sample_subset") or cy.sampling_pattern not in ("AUTOMATIC", "BLUE_NOISE"):
        return ""
    return ("Blender %s's %s sampling pattern depends on the sample count, and %s cannot render a part of a "
            "render's samples (Tabulated Sobol can be split)" % (version(), cy.sampling_pattern.replace("_", " ").title(), version()))


def version():
    """The build's version, major.minor.patch (version_string adds " LTS" to some)."""
    return "%d.%d.%d" % tuple(bpy.app.version)


def set_file_format(s, fmt):
    """Sets the image settings' format, named as every line names it (OPEN_EXR_MULTILAYER, PNG,
    FFMPEG...): 5.0 first needs the media type the format is of (multilayer EXR is a type of its
    own there, MULTI_LAYER_IMAGE, and movies are VIDEO)."""
    if hasattr(s, "media_type"):
        s.media_type = "MULTI_LAYER_IMAGE" if fmt == "OPEN_EXR_MULTILAYER" else "VIDEO" if fmt == "FFMPEG" else "IMAGE"
    s.file_format = fmt


def strips(sc):
    """Every strip of the scene's sequencer: strips_all from 4.4 (sequences_all is gone in 5.0)."""
    se = sc.sequence_editor
    if se is None:
        return []
    return se.strips_all if hasattr(se, "strips_all") else se.sequences_all


# --- OpenEXR headers -----------------------------------------------------------------------

def exr_header(path):
    """The attributes of a single-part OpenEXR file's header: name -> (type, bytes)."""
    with open(path, "rb") as f:
        data = f.read(1 << 24)
    if data[:4] != b"\x76\x2f\x31\x01":
        raise RuntimeError("%s is not an OpenEXR file" % path)
    off, attrs = 8, {}
    while True:
        end = data.index(b"\0", off)
        name = data[off:end].decode("utf-8", "replace")
        off = end + 1
        if not name:
            return attrs
        end = data.index(b"\0", off)
        typ = data[off:end].decode("ascii", "replace")
        off = end + 1
        size = struct.unpack_from("<i", data, off)[0]
        off += 4
        attrs[name] = (typ, data[off:off + size])
        off += size


def exr_channels(path):
    """The channel names of an OpenEXR file, in the file's (sorted) order."""
    typ, val = exr_header(path)["channels"]
    out, off = [], 0
    while True:
        end = val.index(b"\0", off)
        name = val[off:end].decode("utf-8", "replace")
        if not name:
            return out
        out.append(name)
        off = end + 1 + 16


def exr_strings(path, prefix):
    """The string attributes of an OpenEXR header whose names start with prefix."""
    return {k: v.decode("utf-8", "replace") for k, (t, v) in exr_header(path).items()
            if t == "string" and k.startswith(prefix)}


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
    """What decides Cycles' bits on this machine: Blender's build, the CPU kernel, the BVH. The
    kernel is the best this CPU has that the environment does not switch off (Cycles reads
    CYCLES_CPU_NO_AVX2 and the like; the pool sets them to cap the kernel)."""
    cy = bpy.context.scene.cycles
    flags = cpu_flags()
    kernel = "sse2"
    for name, flag, env in (("avx2", "avx2", "CYCLES_CPU_NO_AVX2"), ("avx", "avx", "CYCLES_CPU_NO_AVX"),
                            ("sse41", "sse4_1", "CYCLES_CPU_NO_SSE41")):
        if flag in flags and not os.environ.get(env):
            kernel = name
            break
    bvh = "embree" if _cycles is not None and _cycles.with_embree and cy.debug_bvh_layout == "EMBREE" else "bvh2"
    hash_ = bpy.app.build_hash.decode("ascii", "replace") if isinstance(bpy.app.build_hash, bytes) else str(bpy.app.build_hash)
    return {"version": version(), "hash": hash_, "kernel": kernel, "bvh": bvh,
            "cycles": _cycles is not None, "denoiser": "oidn" if has_denoiser() else "none"}


# --- opening scenes --------------------------------------------------------------------------

current = {"file": None}


def open_file(path, prepare=True):
    """Opens path unless it is open already, prepared for tile renders (prepare_tiles) unless
    prepare is false. The scene's own settings that a tile render changes are kept in
    current["own"], for whole-frame renders and the assembly."""
    if current["file"] == path:
        return
    current["file"] = None
    if not os.path.isfile(path):
        raise SceneError("no such file: %s" % path)
    try:
        bpy.ops.wm.open_mainfile(filepath=path, load_ui=False, use_scripts=False)
    except RuntimeError as e:
        raise SceneError("opening %s: %s" % (os.path.basename(path), str(e).strip()))
    if prepare:
        sc = bpy.context.scene
        keep_own(sc)
        prepare_tiles(sc)
        current["file"] = path


def scene_cameras(sc):
    return sorted(o.name for o in sc.objects if o.type == "CAMERA")


# --- inspect: what a submission needs to know, and what stops it -----------------------------

SEQ_DIGITS = re.compile(r"^(.*?)(\d+)(\.[^.]*)$")


def expand(path, datablock):
    """Every file behind one dependency: a directory's files, UDIM tiles, image and volume sequences."""
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
    # An image sequence, or a volume's OpenVDB sequence: every frame's file is sent (the job's
    # frames are not known here).
    if datablock is not None and (getattr(datablock, "source", "") == "SEQUENCE" or getattr(datablock, "is_sequence", False)):
        d, base = os.path.split(path)
        m = SEQ_DIGITS.match(base)
        if m and os.path.isdir(d):
            head, digits, tail = m.groups()
            pat = re.compile("^" + re.escape(head) + r"\d{%d,}" % len(digits) + re.escape(tail) + "$")
            return [os.path.join(d, f) for f in sorted(os.listdir(d)) if pat.match(f)]
    return [path]


def disk_caches():
    """The directories of the caches Blender keeps on disk for the scene's simulations, which
    blend_paths does not list: point caches (particles, cloth, soft bodies, dynamic paint, rigid
    bodies) under //blendcache_<name of the .blend>/ or their own directory, and fluid caches;
    as (what uses it, the path as stored, its absolute path). A cache not on disk is Blender's
    to simulate, as it would."""
    base = os.path.splitext(os.path.basename(bpy.data.filepath))[0]
    out = []

    def point(label, pc):
        if pc is None or not (pc.use_disk_cache or pc.use_external) or (pc.use_external and not pc.filepath):
            return
        raw = pc.filepath if pc.use_external else "//blendcache_" + base
        out.append((label, raw, os.path.normpath(bpy.path.abspath(raw))))

    for o in bpy.data.objects:
        if o.library is not None:
            continue
        for ps in getattr(o, "particle_systems", []):
            point("the particle system %r of %r" % (ps.name, o.name), ps.point_cache)
        for m in o.modifiers:
            point("the %s %r of %r" % (m.type.lower().replace("_", " "), m.name, o.name), getattr(m, "point_cache", None))
            fluid = getattr(m, "domain_settings", None)
            if fluid is not None and fluid.cache_directory:
                raw = fluid.cache_directory
                out.append(("the fluid domain %r of %r" % (m.name, o.name), raw, os.path.normpath(bpy.path.abspath(raw))))
    for sc in bpy.data.scenes:
        world = getattr(sc, "rigidbody_world", None)
        if world is not None:
            point("the rigid body world of %r" % sc.name, world.point_cache)
    return out


def owners():
    """Maps absolute paths, and paths as stored with Windows' separators made "/" (how
    blend_paths reports a drive letter's or a share's), to the datablock that names them, for
    clear errors."""
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
            out.setdefault(fp.replace("\\", "/"), (kind, db))
    return out


# What reads neighbouring pixels or the whole render while rendering: a frame with any of them
# on renders whole (one tile, one pass) unless the artist asks to split it, when they are
# switched off. (where, attribute) -> its value when split.
SPLIT_VALUE = {("cycles", "use_adaptive_sampling"): False, ("cycles", "use_denoising"): False,
               ("cycles", "use_guiding"): False, ("cycles", "time_limit"): 0.0,
               ("cycles", "use_layer_samples"): "IGNORE", ("render", "use_freestyle"): False}


def obj(sc, where):
    return sc.cycles if where == "cycles" else sc.render


def whole_only(sc):
    """The settings of SPLIT_VALUE this build has: (object, attribute, value when split)."""
    return [(obj(sc, w), a, v) for (w, a), v in SPLIT_VALUE.items() if hasattr(obj(sc, w), a)]


def keep_own(sc):
    current["own"] = {a: getattr(o, a) for o, a, _ in whole_only(sc)}
    current["own"]["use_stamp"] = sc.render.use_stamp


def has_denoiser():
    return _cycles is not None and bool(getattr(_cycles, "with_openimagedenoise", False))


def unsplittable(sc):
    """The scene's settings that read neighbouring pixels or the whole render while rendering, as
    (why the frame renders whole, what splitting it switches off), one pair per setting on."""
    cy, r = sc.cycles, sc.render
    out = []
    if cy.use_adaptive_sampling:
        out.append(("adaptive sampling (noise threshold %g) reads neighbouring pixels while rendering" % cy.adaptive_threshold,
                    "adaptive sampling (noise threshold %g) is off: every pixel renders all %d samples" % (cy.adaptive_threshold, cy.samples)))
    if cy.use_denoising and has_denoiser():
        out.append(("denoising (%s) needs the whole frame" % cy.denoiser, "denoising (%s) is off: it needs the whole frame" % cy.denoiser))
    if getattr(cy, "use_guiding", False):
        out.append(("path guiding learns across samples", "path guiding is off: it learns across samples"))
    if cy.time_limit > 0:
        out.append(("the time limit (%gs) stops the frame, not a tile" % cy.time_limit,
                    "the time limit (%gs) is off: every tile renders all its samples" % cy.time_limit))
    if cy.use_layer_samples == "USE" and any(vl.samples > 0 for vl in sc.view_layers):
        out.append(("view layers have their own sample counts",
                    "view layer sample counts are ignored: every layer renders %d samples" % cy.samples))
    if r.use_freestyle:
        out.append(("Freestyle's lines need the whole frame", "Freestyle is off: its lines need the whole frame"))
    return out


def caveats(sc):
    """What the farm does differently from Blender whatever the mode, one line each."""
    cy, r = sc.cycles, sc.render
    out = []
    if cy.use_denoising and not has_denoiser():
        out.append("denoising is on, but this Blender has no denoiser (Blender itself fails such a render): "
                   "frames are delivered undenoised, with their denoising data passes")
    if r.use_sequencer and len(strips(sc)) > 0:
        out.append("the sequencer is off: tilefarm renders the 3D scene")
    if cy.device != "CPU":
        out.append("the GPU device is not used: tiles render on the CPU")
    return out


# Object types that can be a shadow catcher (a light's is_shadow_catcher means nothing).
GEOMETRY = {"MESH", "CURVE", "SURFACE", "META", "FONT", "VOLUME", "CURVES", "POINTCLOUD"}


def has_volumes(sc):
    """Whether a material of the scene's objects, or its world, has a volume shader."""
    def volume(tree):
        return tree is not None and any(n.type in ("OUTPUT_MATERIAL", "OUTPUT_WORLD") and n.inputs.get("Volume") is not None
                                         and n.inputs["Volume"].is_linked for n in tree.nodes)
    for o in sc.objects:
        for slot in getattr(o, "material_slots", []):
            if slot.material is not None and slot.material.use_nodes and volume(slot.material.node_tree):
                return True
    return sc.world is not None and sc.world.use_nodes and volume(sc.world.node_tree)


def layer_info(sc):
    return [{"name": vl.name, "aovs": [a.name for a in vl.aovs],
             "lightgroups": [g.name for g in getattr(vl, "lightgroups", [])]}
            for vl in sc.view_layers if vl.use]


def output_info(sc):
    """The file a render of the scene writes, as Blender decides it, and its File Output nodes."""
    r = sc.render
    s = r.image_settings
    files = []
    tree = compositor(sc)
    if r.use_compositing and tree is not None:
        for n in tree.nodes:
            if n.type == "OUTPUT_FILE" and not n.mute:
                if not file_output_dir(n).startswith("//"):
                    raise SceneError("the File Output node %r writes to the absolute path %s: make it relative "
                                     "(start it with //) so the farm can deliver its files" % (n.name, file_output_dir(n)))
                files.append(n.name)
    if s.file_format in ("AVI_JPEG", "AVI_RAW", "FFMPEG"):
        raise SceneError("the scene renders to a movie (%s); tilefarm renders frames: choose an image format "
                         "(Output Properties > Output) and encode the movie from them" % s.file_format)
    refused = []
    if r.use_multiview:
        refused.append("stereoscopy or multi-view (Output Properties > Stereoscopy), whose views the farm does not "
                       "render: turn it off, or render each view's camera as its own job")
    if r.use_border:
        refused.append("a render region (Output Properties > Format > Render Region%s), which the farm does not "
                       "render: clear it (Ctrl+Alt+B in the camera view) to render the whole frame" % (", cropped" if r.use_crop_to_border else ""))
    if s.file_format in ("OPEN_EXR", "OPEN_EXR_MULTILAYER") and getattr(s, "use_preview", False):
        refused.append("the JPEG preview of the EXR (Output Properties > Output > Preview), a second file the farm "
                       "does not write: turn Preview off")
    if refused:
        raise SceneError("the scene asks for " + "; and ".join(refused))
    return {"file_format": s.file_format, "color_mode": s.color_mode, "color_depth": s.color_depth,
            "exr_codec": s.exr_codec, "extension": r.file_extension, "use_extension": r.use_file_extension,
            "path": r.filepath, "compositing": bool(r.use_compositing and tree is not None),
            "file_outputs": files}


def probe(sc, frame, out):
    """Renders one pixel at one sample into a multilayer EXR at out: its channels are exactly
    those of every tile of the frame, and its header carries the Cryptomatte manifests, which
    Cycles writes only into a render's metadata."""
    r, cy = sc.render, sc.cycles
    if sc.frame_current != frame:
        sc.frame_set(frame)
    for attr, value in (("border_min_x", 0.0), ("border_max_x", f32(1.0 / r.resolution_x)),
                        ("border_min_y", 0.0), ("border_max_y", f32(1.0 / r.resolution_y))):
        put(r, attr, value)
    set_samples(cy, 0, 1, 1)
    if os.path.exists(out):
        os.remove(out)
    r.filepath = out
    bpy.ops.render.render(write_still=True)
    if not os.path.isfile(out):
        raise RuntimeError("Blender wrote no image to %s" % out)


def inspect(req):
    open_file(req["file"], prepare=False)  # the scene's own settings; a render opens it afresh
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
        kind, db = who.get(full) or who.get(raw.replace("\\", "/"), ("file", None))
        label = "%s %r" % (kind, db.name) if db is not None else kind
        if not raw.startswith("//"):
            abs_refs.append("%s uses the absolute path %s" % (label, raw))
            continue
        files = expand(full, db)
        if not files or not all(os.path.exists(f) for f in files):
            missing.append("%s needs %s, which is missing" % (label, raw))
            continue
        deps += files
    for label, raw, full in disk_caches():
        if not os.path.isdir(full):
            continue  # nothing baked: Blender simulates, on the farm as here
        if not raw.startswith("//"):
            abs_refs.append("%s uses the absolute path %s" % (label, raw))
            continue
        deps += expand(full, None)
    if abs_refs:
        raise SceneError("; ".join(abs_refs) + ": make paths relative (File > External Data > Make Paths Relative) so the farm can find them")
    if missing:
        raise SceneError("; ".join(missing))
    r, cy = sc.render, sc.cycles
    info = {"scene": sc.name, "deps": sorted(set(deps)),
            "cameras": cams, "camera": sc.camera.name if sc.camera is not None and sc.camera.type == "CAMERA" else "",
            "width": r.resolution_x * r.resolution_percentage // 100,
            "height": r.resolution_y * r.resolution_percentage // 100,
            "spp": cy.samples, "seed": cy.seed, "max_bounces": cy.max_bounces,
            "frame_start": sc.frame_start, "frame_end": sc.frame_end, "frame_step": sc.frame_step,
            "view_transform": sc.view_settings.view_transform, "look": sc.view_settings.look,
            "exposure": sc.view_settings.exposure, "gamma": sc.view_settings.gamma,
            "whole": [why for why, _ in unsplittable(sc)], "split_off": [off for _, off in unsplittable(sc)],
            "caveats": caveats(sc), "one_pass": [why for why in [count_dependent_pattern(cy)] if why],
            "layers": layer_info(sc), "output": output_info(sc), "film_transparent": bool(r.film_transparent),
            "shadow_catcher": any(getattr(o, "is_shadow_catcher", False) for o in sc.objects if o.type in GEOMETRY),
            "volumes": has_volumes(sc)}
    # The channels every tile carries: a one-pixel render of the scene prepared as a tile is.
    keep_own(sc)
    helpers = helper_passes(sc)
    prepare_tiles(sc)
    for o, attr, split in whole_only(sc):
        put(o, attr, split)
    r.resolution_x, r.resolution_y = info["width"], info["height"]
    if helpers:
        # The channels of the colour passes only the tiles render: the ones a probe without
        # them lacks.
        for vl, attr in helpers:
            setattr(vl, attr, False)
        probe(sc, frame, req["probe"])
        own = set(exr_channels(req["probe"]))
        for vl, attr in helpers:
            setattr(vl, attr, True)
    probe(sc, frame, req["probe"])
    info["channels"] = exr_channels(req["probe"])
    os.remove(req["probe"])
    if helpers:
        info["drop"] = [c for c in info["channels"] if c not in own]
    if info["whole"]:
        # A frame rendered whole keeps the settings split ones switch off, and denoising adds
        # its Noisy Image pass: its tiles' channels, if they are others.
        for o, attr, _ in whole_only(sc):
            put(o, attr, current["own"][attr])
        probe(sc, frame, req["probe"])
        whole = exr_channels(req["probe"])
        os.remove(req["probe"])
        if whole != info["channels"]:
            info["whole_channels"] = whole
    return info


# --- render: one pass of one tile -------------------------------------------------------------

def edge(p, n):
    """The border float Blender turns back into exactly pixel p of n: int(float32(f) * n) == p."""
    if p == 0:
        return 0.0
    if p == n:
        return 1.0
    return (p + 0.5) / n


def prepare_tiles(sc):
    """Prepares the scene for tile renders: every view layer (unless the scene renders a single
    one) and pass into one float multilayer EXR of the tile, on the CPU with a fixed number of
    threads (THREADS, or a request's own: render); the
    compositor runs once on the assembled frame (assemble), the sequencer not at all. The
    settings a frame renders whole for (whole_only) are set per request (render); everything
    else is the scene's own."""
    cy, r = sc.cycles, sc.render
    cy.device = "CPU"
    if cy.use_denoising and not has_denoiser():
        cy.use_denoising = False  # Blender itself would fail the render
        current["own"]["use_denoising"] = False
    r.use_compositing = False
    r.use_sequencer = False
    r.use_stamp = False  # the stamp is burnt once, into the assembled frame (assemble)
    r.threads_mode = "FIXED"
    r.threads = THREADS
    # Keeps the synced scene and its BVH between the passes a process renders; a pass's bits
    # do not depend on what the process rendered before (tested). Not with several view
    # layers: Blender 3.4 then carries one layer's Cryptomatte into the next, and reorders the
    # Cryptomatte manifests.
    r.use_persistent_data = sum(1 for vl in sc.view_layers if vl.use) == 1 or r.use_single_layer
    for vl, attr in helper_passes(sc):
        setattr(vl, attr, True)
    r.use_border, r.use_crop_to_border = True, True
    r.resolution_percentage = 100
    r.use_file_extension = False
    s = r.image_settings
    set_file_format(s, "OPEN_EXR_MULTILAYER")
    s.color_depth = "32"
    s.exr_codec = "NONE"


# The colour pass Cycles divides each light pass by, by their view layer settings.
LIGHT_COLOUR = {"use_pass_diffuse_direct": "use_pass_diffuse_color", "use_pass_diffuse_indirect": "use_pass_diffuse_color",
                "use_pass_glossy_direct": "use_pass_glossy_color", "use_pass_glossy_indirect": "use_pass_glossy_color",
                "use_pass_transmission_direct": "use_pass_transmission_color",
                "use_pass_transmission_indirect": "use_pass_transmission_color"}


def helper_passes(sc):
    """The colour passes a tile renders beyond the scene's own, as (view layer, setting): a light
    pass combines across sample ranges only weighted by its colour pass, so a layer with a light
    pass but not its colour renders the colour too, and the assembled frame leaves it out
    (inspect's "drop")."""
    out = []
    for vl in sc.view_layers:
        for light, colour in LIGHT_COLOUR.items():
            if getattr(vl, light) and not getattr(vl, colour) and (vl, colour) not in out:
                out.append((vl, colour))
    return out


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
    for o, attr, split in whole_only(sc):
        put(o, attr, current["own"][attr] if req.get("whole") else split)
    put(cy, "seed", req["seed"])
    put(r, "threads", req.get("threads") or THREADS)  # more when idle slots lend theirs; same bits
    set_samples(cy, req["from"], req["to"], req["spp"])
    out = req["out"]
    if os.path.exists(out):
        os.remove(out)
    r.filepath = out
    start = time.perf_counter()
    bpy.ops.render.render(write_still=True)
    seconds = time.perf_counter() - start
    if not os.path.isfile(out):
        raise RuntimeError("Blender wrote no image to %s" % out)
    print("tilefarm: rendered samples %d-%d of tile %d,%d-%d,%d of frame %d with %d threads" % (req["from"], req["to"], x0, y0, x1, y1, req["frame"], r.threads), flush=True)
    return {"render_seconds": seconds}


# --- assemble: the assembled frame through Blender's own pipeline -----------------------------

# The passes of the assembled frame, by view layer: [(pass, channels, channel ids, type)], and
# the render metadata (Cryptomatte manifests) to stamp into its result.
assembling = {"passes": {}, "stamp": {}, "file": None}


class Assembler(bpy.types.RenderEngine):
    """A render engine that renders nothing: its result is the assembled frame, read from a
    multilayer EXR, so Blender's own pipeline runs the compositor on it (Render Layers nodes
    fed from its layers and passes) and writes the file the scene asks for, as after a render."""
    bl_idname = "TILEFARM_ASSEMBLE"
    bl_label = "tilefarm assembly"
    bl_use_postprocess = True

    def update_render_passes(self, scene=None, renderlayer=None):
        for name, n, ids, typ in assembling["passes"].get(renderlayer.name, []):
            self.register_pass(scene, renderlayer, name, n, ids, typ)

    def render(self, depsgraph):
        sc = depsgraph.scene
        layer = depsgraph.view_layer.name
        for name, n, ids, typ in assembling["passes"].get(layer, []):
            if name != "Combined":
                self.add_pass(name, n, ids, layer=layer)
        w = sc.render.resolution_x * sc.render.resolution_percentage // 100
        h = sc.render.resolution_y * sc.render.resolution_percentage // 100
        result = self.begin_result(0, 0, w, h, layer=layer)
        result.load_from_file(assembling["file"])
        for k, v in assembling["stamp"].items():
            self.get_result().stamp_data_add_field(k, v)
        self.end_result(result)


PASS_TYPES = {1: "VALUE", 3: "VECTOR", 4: "COLOR"}


def layer_passes(channels, layers):
    """Groups "Layer.Pass.Channel" names by view layer and pass, in the order they come."""
    out = {}
    for name in channels:
        layer = max((l for l in layers if name.startswith(l + ".")), key=len, default=None)
        if layer is None:
            continue
        pass_, _, chan = name[len(layer) + 1:].rpartition(".")
        passes = out.setdefault(layer, [])
        if passes and passes[-1][0] == pass_:
            passes[-1][1].append(chan)
        else:
            passes.append((pass_, [chan]))
    return {l: [(p, len(cs), chan_id(cs), PASS_TYPES.get(len(cs), "COLOR")) for p, cs in ps] for l, ps in out.items()}


# The channel orders Cycles gives its passes ("chan_id"); an EXR lists channels sorted by name.
CHAN_IDS = ("RGBA", "RGB", "XYZW", "XYZ", "UVA", "UV", "XY")


def chan_id(chans):
    """The pass's channels in Cycles' order ("B", "G", "R" from the EXR: "RGB"). Blender writes a
    pass as half in a half-float EXR only if it is a colour ("RGB", "RGBA"), and the compositor
    reads a pass's values in this order."""
    for cid in CHAN_IDS:
        if sorted(cid) == sorted(chans):
            return cid
    return "".join(chans)


# Output formats the farm offers besides the scene's own ("blend"): the Composite result.
FORMATS = {"png": ("PNG", "RGB", "8", None), "png16": ("PNG", "RGB", "16", None), "exr": ("OPEN_EXR", "RGB", "32", "ZIP")}


def assemble(req):
    """Writes the assembled frame req["in"] (a float multilayer EXR of every tile channel) as
    Blender writes a render of the scene: the compositor run on it, the File Output nodes'
    files, and the output file in each of req["formats"] (the scene's own format, "blend",
    first if asked for, or one of FORMATS), all under req["out"]: main/<name>, more/<i>/<name>
    and files/<path under the .blend's directory>. The first format is rendered, compositor
    and all; each next one is the same Render Result saved again (save_render writes the
    bytes Blender's pipeline writes for that format from the same result, on every line)."""
    formats = req["formats"]
    if not formats or "blend" in formats[1:] or any(f != "blend" and f not in FORMATS for f in formats):
        raise SceneError("cannot assemble the formats %r: the scene's own first, then any of %s" % (formats, sorted(FORMATS)))
    current["file"] = None  # opened afresh: the probe below must be the process's first render
    open_file(req["file"])
    sc = bpy.context.scene
    current["file"] = None  # the scene is changed below: the next request opens it afresh
    if sc.frame_current != req["frame"]:
        sc.frame_set(req["frame"])
    cam = sc.objects.get(req["camera"])
    if cam is None or cam.type != "CAMERA":
        raise SceneError("the scene has no camera %r" % req["camera"])
    sc.camera = cam
    r = sc.render
    r.resolution_x, r.resolution_y, r.resolution_percentage = req["width"], req["height"], 100
    own = {k: v for k, v in req["own"].items()}
    outdir = req["out"]
    stamp = {}
    if any(".Crypto" in c for c in req["channels"]):
        for o, attr, split in whole_only(sc):
            put(o, attr, split)
        probe_out = os.path.join(outdir, "probe.exr")  # the manifests: a one-pixel render says
        probe(sc, req["frame"], probe_out)
        stamp = exr_strings(probe_out, "cryptomatte/")
        os.remove(probe_out)
    layers = [vl.name for vl in sc.view_layers if vl.use]
    assembling.update(passes=layer_passes(req["channels"], layers), stamp=stamp, file=req["in"])
    r.engine = Assembler.bl_idname
    r.use_border = False
    r.use_stamp = current["own"]["use_stamp"]  # burnt once, here, where the tiles had none
    # What would make two assemblies of the same tiles differ in their bytes (the promotion of a
    # frame is idempotent only for identical bytes) stays out of the file's metadata.
    for attr in ("use_stamp_date", "use_stamp_render_time", "use_stamp_memory", "use_stamp_hostname", "use_stamp_filename"):
        setattr(r, attr, False)
    r.use_compositing = own["compositing"]
    s = r.image_settings
    fmt = formats[0]
    if fmt == "blend":
        set_file_format(s, own["file_format"])
        s.color_mode = own["color_mode"]
        s.color_depth = own["color_depth"]
        s.exr_codec = own["exr_codec"]
        r.use_file_extension = own["use_extension"]
        r.filepath = own["path"]
        name = r.frame_path(frame=req["frame"])
        if own["path"].startswith("//"):  # named as the .blend's directory sees it
            name = "//" + os.path.relpath(name, os.path.dirname(bpy.data.filepath)).replace(os.sep, "/")
    else:
        farm_format(s, fmt)
        name = "frame"
        r.use_file_extension = True
    # The main file lands alone in main/ (its name there is not used: name is where it goes),
    # File Output nodes' files under files/ by their path.
    r.filepath = os.path.join(outdir, "main", "frame_")
    files = {}
    tree = compositor(sc)
    if own["compositing"] and tree is not None:
        for n in tree.nodes:
            if n.type == "OUTPUT_FILE":
                if fmt != "blend":
                    n.mute = True  # the farm's own formats are the Composite alone
                    continue
                base = file_output_dir(n)
                rel = base[2:] if base.startswith("//") else base.lstrip("/")
                set_file_output_dir(n, os.path.join(outdir, "files", rel))
    # An animation render of this one frame, as Blender's own -a and -f are: 5.0's File Output
    # nodes number their files only in an animation render. The frame end stays the scene's
    # (a step past it renders the one frame): the stamp pads the frame number to its digits.
    end = max(sc.frame_end, req["frame"])
    sc.frame_start, sc.frame_end = req["frame"], end
    sc.frame_step = end - req["frame"] + 1
    bpy.ops.render.render(animation=True)
    written = os.listdir(os.path.join(outdir, "main")) if os.path.isdir(os.path.join(outdir, "main")) else []
    if len(written) != 1:
        raise RuntimeError("Blender wrote %d images for the frame, want 1: %s" % (len(written), written))
    main = os.path.join(outdir, "main", written[0])
    for root, _, names in os.walk(os.path.join(outdir, "files")):
        for f in names:
            full = os.path.join(root, f)
            files[os.path.relpath(full, os.path.join(outdir, "files"))] = full
    outputs = [{"main": os.path.relpath(main, outdir), "name": name, "files": sorted(files)}]
    # The render's own image: found by type, since a .blend may name an image "Render Result".
    result = next(i for i in bpy.data.images if i.type == "RENDER_RESULT")
    for i, more in enumerate(formats[1:], 1):
        farm_format(s, more)
        path = os.path.join(outdir, "more", str(i), "frame." + ("exr" if more == "exr" else "png"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        result.save_render(path, scene=sc)
        outputs.append({"main": os.path.relpath(path, outdir), "name": "frame", "files": []})
    return {"outputs": outputs}


def farm_format(s, fmt):
    """Sets the image settings to one of the farm's FORMATS."""
    ff, mode, depth, codec = FORMATS[fmt]
    set_file_format(s, ff)
    s.color_mode, s.color_depth = mode, depth
    if codec:
        s.exr_codec = codec


OPS = {"inspect": inspect, "render": render, "assemble": assemble}


def main():
    module_mode()
    bpy.utils.register_class(Assembler)
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
