"""Saves the example scene as a .blend made on Windows would name its files: relative paths with
backslashes ("//textures\\checker.png"), as Blender on Windows writes them; with "absolute" as a
second argument, also an image at a drive letter and one on a UNC share, which cannot travel.

Run: blender -b EXAMPLE.blend --python make_winpaths.py -- OUT.blend [absolute]
"""
import sys

import bpy

args = sys.argv[sys.argv.index("--") + 1:]
for img in bpy.data.images:
    if img.filepath.startswith("//"):
        img.filepath = "//" + img.filepath[2:].replace("/", "\\")
if "absolute" in args[1:]:
    for name, path in (("Drive", "C:\\textures\\wood.png"), ("Share", "\\\\server\\share\\wood.png")):
        img = bpy.data.images.new(name, 4, 4)
        img.source = "FILE"
        img.filepath = path
        img.use_fake_user = True
bpy.ops.wm.save_as_mainfile(filepath=args[0], relative_remap=False)
