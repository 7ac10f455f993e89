# tilefarm's Blender add-on: a panel in Render Properties that submits the saved .blend to a
# tilefarm render farm through tilefarm's own `coordinator submit` and follows the job
# (docs/artists.md). Installed from the zip blender/addon builds (Preferences > Add-ons >
# Install); written for Blender 3.4, the farm's, and later.

bl_info = {
    "name": "tilefarm",
    "author": "tilefarm",
    "version": (1, 0, 0),
    "blender": (3, 4, 0),
    "location": "Properties > Render > tilefarm",
    "description": "Submit the saved .blend to a tilefarm render farm and follow its progress",
    "category": "Render",
}

if "bpy" in locals():
    # Reload Scripts (F3 > Reload Scripts) reloads the modules in dependency order.
    import importlib

    for _name in ("farm", "settings", "progress", "operators", "panel"):
        if _name in locals():
            importlib.reload(locals()[_name])

import bpy  # noqa: E402

from . import farm, operators, panel, progress, settings  # noqa: E402,F401

_modules = (settings, progress, operators, panel)


def register():
    for m in _modules:
        m.register()


def unregister():
    for m in reversed(_modules):
        m.unregister()
