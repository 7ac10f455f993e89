# The farm as the add-on reaches it: the tilefarm command line to submit (so a .blend is bundled
# and checked exactly as `coordinator submit` does it: docs/design.md, "Flows": Scene file and
# Submit), and the HTTP API for a job's status (GET /v1/jobs/{id}). Nothing here imports bpy:
# these functions take plain values and raise FarmError with the reason to report.

import json
import os
import shutil
import subprocess
import threading
import sys
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_SERVER = "http://127.0.0.1:7070"

# The environment the command line reads too (docs/operations.md).
ENV_SERVER = "TILEFARM_SERVER"
ENV_TOKEN = "TILEFARM_API_TOKEN"
ENV_BLENDER = "TILEFARM_BLENDER"
# The add-on's own: where the coordinator command is, when not in the preferences.
ENV_COORDINATOR = "TILEFARM_COORDINATOR"

# The exit codes of submit (the command contract; internal/api/errors.go).
EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_RENDERING = 3
EXIT_QUEUED = 42
EXIT_BUSY = 75
EXIT_INTERRUPTED = 130

FINISHED_STATES = ("completed", "failed", "cancelled")

PREFERENCES = "Edit > Preferences > Add-ons > tilefarm"


class FarmError(Exception):
    """Something the artist is told as it is: the message is the whole reason."""


def servers(server):
    """The farm's base URLs: one, or several separated by commas as the command line's --server
    takes them (tried in turn while one does not answer); http:// when no scheme is given, no
    trailing slash."""
    out = []
    for s in server.split(","):
        s = s.strip()
        if s:
            out.append((s if "://" in s else "http://" + s).rstrip("/"))
    return out or ["http://"]


def normalize_server(server):
    """The farm's address as the command line takes it: its base URLs, separated by commas."""
    return ",".join(servers(server))


def monitor_url(server, job_id):
    """The job's page in the web monitor (docs/web.md: the route #/jobs/ID), at the farm's
    first address."""
    return "%s/#/jobs/%s" % (servers(server)[0], urllib.parse.quote(job_id, safe=""))


# The coordinator command's file name on this system.
COORDINATOR = "coordinator.exe" if sys.platform == "win32" else "coordinator"

# Commands found to be tilefarm's coordinator, by path: asked once per Blender session.
_checked = {}


def find_coordinator(configured):
    """The coordinator command: the one the preferences name, else $TILEFARM_COORDINATOR, else
    one next to the add-on (a release's zip unpacked beside it), else `coordinator` on PATH
    (coordinator.exe on Windows). One named but missing is an error, never silently another
    one; one that is not tilefarm's coordinator (another program of that name, a build for
    another system) is an error saying so."""
    for candidate, where in ((configured, "the add-on's preferences"),
                             (os.environ.get(ENV_COORDINATOR, ""), ENV_COORDINATOR)):
        candidate = candidate.strip()
        if not candidate:
            continue
        path = os.path.expanduser(candidate)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return checked(path, where)
        if os.sep not in path and "/" not in path:
            found = shutil.which(path)
            if found:
                return checked(found, where)
        raise FarmError("The coordinator command %r set in %s does not exist or cannot run: "
                        "set the path of tilefarm's coordinator there" % (candidate, where))
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), COORDINATOR)
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return checked(beside, "the add-on's directory")
    found = shutil.which("coordinator")
    if found:
        return checked(found, "PATH")
    raise FarmError("tilefarm's coordinator command was not found: set its path in %s (or %s), "
                    "or put it on PATH" % (PREFERENCES, ENV_COORDINATOR))


def checked(path, where):
    """path, once `path --version` said it is tilefarm's coordinator."""
    if _checked.get(path):
        return path
    kw = {}
    if sys.platform == "win32":
        kw["creationflags"] = getattr(subprocess, "CREATE_NO_WINDOW", 0)
    try:
        p = subprocess.run([path, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30, encoding="utf-8", errors="replace", **kw)
        answer = p.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        answer = str(e)
    # tilefarm's answer: "coordinator VERSION (tilefarm/BUILD, SYSTEM)" (cli.Version).
    if not answer.startswith("coordinator ") or "(tilefarm/" not in answer:
        raise FarmError("%s (from %s) is not tilefarm's coordinator, or not a build for this system: "
                        "asked for its version it answered %r" % (path, where, answer[:200]))
    _checked[path] = True
    return path


class Submission:
    """A submission of a saved .blend, as the panel's settings make it."""

    def __init__(self, blend, server, token="", frames=None, priority=0, preview=0, tile=0,
                 passes=0, split=False, requires=(), blender=""):
        self.blend = blend
        self.server = normalize_server(server)
        self.token = token
        self.frames = frames  # (first, last), or None for the scene's own range and step
        self.priority = priority
        self.preview = preview
        self.tile = tile
        self.passes = passes
        self.split = split
        self.requires = [t.strip() for t in requires if t.strip()]
        self.blender = blender

    def args(self, coordinator):
        """The command line: `coordinator submit BLEND --json` and the settings' flags."""
        a = [coordinator, "submit", self.blend, "--json", "--server", self.server,
             "--priority", str(self.priority)]
        if self.frames is not None:
            first, last = self.frames
            a += ["--frames", "%d-%d" % (first, last)]
        if self.preview > 0:
            a += ["--preview", str(self.preview)]
        if self.tile > 0:
            a += ["--tile", str(self.tile)]
        if self.passes > 0:
            a += ["--passes", str(self.passes)]
        if self.split:
            a.append("--split")
        if self.requires:
            a += ["--requires", ",".join(self.requires)]
        if self.blender:
            a += ["--blender", self.blender]
        return a

    def env(self):
        """The command's environment: this one, with the token where the command reads it (never
        on its command line, where a process listing shows it)."""
        env = dict(os.environ)
        if self.token:
            env[ENV_TOKEN] = self.token
        return env


def unsaved_changes():
    """Whether the open .blend has changes not saved. Blender as a Python module (bpy, no
    executable) never clears is_dirty, not even by saving (4.2, 4.5 and 5.0 alike): there it
    says nothing, and the file on disk is what the farm renders."""
    import bpy
    return bool(bpy.data.is_dirty and bpy.app.binary_path)


def build_name(build):
    """A renderer build as an artist reads it: "Blender 4.5.15" of "blender/4.5.15 (...) ...",
    else the fingerprint itself."""
    name, _, rest = build.partition("/")
    if name == "blender" and rest:
        return "Blender " + rest.split()[0]
    return build


class Submitted:
    """What submit answered: the job's status (submit --json) and the lines it said about the
    scene (how the farm renders it: whole frames, settings switched off, the farm's build)."""

    def __init__(self, status, notes, code):
        self.status = status
        self.notes = notes
        self.code = code


# The upload's progress lines of submit (cli.uploadLine): "uploading 1.2 MiB of 2.0 GiB, 3/50 files".
PROGRESS_PREFIX = "uploading "


def submit(sub, coordinator, timeout, on_progress=None):
    """Runs `coordinator submit` for sub and returns Submitted, or raises FarmError saying why
    the job was not accepted. While the scene's files upload, on_progress (if given) is called
    from the reading thread with each progress line submit prints."""
    kw = {}
    if sys.platform == "win32":
        kw["creationflags"] = getattr(subprocess, "CREATE_NO_WINDOW", 0)
    try:
        p = subprocess.Popen(sub.args(coordinator), env=sub.env(), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             encoding="utf-8", errors="replace", **kw)
    except OSError as e:
        raise FarmError("Could not run %s: %s" % (coordinator, e.strerror or e)) from None
    lines = []

    def read_stderr():
        for line in p.stderr:
            if line.startswith(PROGRESS_PREFIX):
                if on_progress is not None:
                    on_progress(line.strip())
                continue
            lines.append(line)

    out = []
    readers = [threading.Thread(target=read_stderr, name="tilefarm submit stderr", daemon=True),
               threading.Thread(target=lambda: out.append(p.stdout.read()), name="tilefarm submit stdout", daemon=True)]
    for r in readers:
        r.start()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise FarmError("The submission took longer than %d s and was stopped; the farm may have "
                        "accepted the job all the same: Submit again returns the same job"
                        % timeout) from None
    for r in readers:
        r.join()
    return interpret(p.returncode, "".join(out), "".join(lines), sub.server, sub.token or os.environ.get(ENV_TOKEN, ""))


def token_refused(server, token):
    """The reason of a 401: no token, or one the farm does not take."""
    if not token:
        return ("The farm at %s needs its API token: set it in %s (or %s)"
                % (server, PREFERENCES, ENV_TOKEN))
    return ("The farm at %s refused the API token: set the farm's token in %s (or %s)"
            % (server, PREFERENCES, ENV_TOKEN))


def interpret(code, stdout, stderr, server, token):
    """Reads submit's exit code, its JSON status on stdout and its lines on stderr."""
    errors, notes = [], []
    for line in stderr.splitlines():
        line = line.strip()
        if not line or line.startswith("Run '"):
            continue
        for prefix in ("coordinator submit: ", "coordinator: "):
            if line.startswith(prefix):
                errors.append(line[len(prefix):])
                break
        else:
            notes.append(line)
    status = None
    if stdout.strip():
        try:
            status = json.loads(stdout)
        except ValueError:
            status = None
    if isinstance(status, dict) and status.get("job_id"):
        # Accepted (0, 42, 3), or the same request's job, which failed or was cancelled (1).
        return Submitted(status, notes, code)
    reason = "; ".join(errors) or (notes[-1] if notes else "no message (exit %d)" % code)
    if code == EXIT_BUSY:
        if reason.endswith(" (retry later)"):
            reason = reason[:-len(" (retry later)")]
        raise FarmError("The farm is busy or unreachable, try again later: %s" % reason)
    if code == EXIT_FAILED and "unauthorized" in reason.lower():
        raise FarmError(token_refused(server, token))
    if code == EXIT_FAILED:
        raise FarmError("The farm refused the job: %s" % reason)
    if code == EXIT_USAGE:
        raise FarmError("The submission's settings were refused: %s" % reason)
    if code == EXIT_INTERRUPTED or code < 0:
        raise FarmError("The submission was interrupted: %s" % reason)
    raise FarmError("coordinator submit failed (exit %d): %s" % (code, reason))


def fetch_status(server, token, job_id, timeout):
    """The job's status from the farm's HTTP API and the address that answered, trying the
    farm's addresses in turn while one is unreachable or answers 502, 503 or 504; or FarmError
    saying why not (for each address, when none answered)."""
    unreachable = []
    for base in servers(server):
        try:
            return _fetch_status_at(base, token, job_id, timeout), base
        except _Unreachable as e:
            unreachable.append(str(e))
    raise FarmError("; ".join(unreachable))


class _Unreachable(FarmError):
    """An address of the farm did not answer: the next one may."""


def _fetch_status_at(server, token, job_id, timeout):
    url = "%s/v1/jobs/%s" % (server, urllib.parse.quote(job_id, safe=""))
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        msg = _error_body(e)
        if e.code == 401:
            raise FarmError(token_refused(server, token)) from None
        if e.code == 404:
            raise FarmError("The farm at %s has no job %s" % (server, job_id)) from None
        if e.code in (502, 503, 504):
            raise _Unreachable("The farm at %s answered %d: %s" % (server, e.code, msg)) from None
        raise FarmError("The farm at %s answered %d: %s" % (server, e.code, msg)) from None
    except urllib.error.URLError as e:
        raise _Unreachable("The farm at %s is unreachable: %s" % (server, e.reason)) from None
    except (OSError, ValueError) as e:  # a timeout, a connection reset, a body that is not JSON
        raise _Unreachable("The farm at %s is unreachable: %s" % (server, e)) from None
    if not isinstance(status, dict) or "state" not in status:
        raise FarmError("The farm at %s answered something that is not a job's status" % server)
    return status


def _error_body(e):
    """The coordinator's words in an error response ({"error": ..., "kind": ...})."""
    try:
        raw = e.read().decode("utf-8", "replace")
    except OSError:
        raw = ""
    try:
        body = json.loads(raw)
        if isinstance(body, dict) and body.get("error"):
            return body["error"]
    except ValueError:
        pass
    return raw.strip() or e.reason or "HTTP %d" % e.code


def progress(status):
    """How far the job is, 0 to 1: its samples when the farm counts them (docs/design.md,
    "Progress"), else its tiles."""
    if status.get("state") == "completed":
        return 1.0
    total = status.get("samples_total") or 0
    if total > 0:
        return min(1.0, (status.get("samples_done") or 0) / total)
    tiles = status.get("tiles_total") or 0
    return min(1.0, (status.get("tiles_completed") or 0) / tiles) if tiles else 0.0


def detail(status):
    """One line on the job: frames and tiles done, the ETA, what it waits for, its first failure."""
    parts = ["frames %d/%d" % (status.get("frames_completed") or 0, status.get("frames_total") or 0),
             "tiles %d/%d" % (status.get("tiles_completed") or 0, status.get("tiles_total") or 0)]
    if status.get("frames_failed"):
        parts.append("%d frames failed" % status["frames_failed"])
    if status.get("preview_frames") and status.get("state") not in FINISHED_STATES:
        parts.append("preview done" if status.get("preview_done") else "preview frames first")
    eta = status.get("eta_seconds")
    if eta is not None and status.get("state") not in FINISHED_STATES:
        parts.append("ETA %s" % _duration(eta))
    if status.get("waiting_for"):
        parts.append("waiting for %s" % status["waiting_for"])
    failures = status.get("failures") or []
    if failures:
        parts.append(failures[0])
    return ", ".join(parts)


def _duration(seconds):
    s = max(0, int(round(seconds)))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    return "%dh%02dm" % (s // 3600, s % 3600 // 60)
