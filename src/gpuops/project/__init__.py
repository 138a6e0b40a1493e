"""What a project needs, judged on this machine before anything is launched (issue 34).

Pure: images (what an image brings: playbooks/images.yaml), resolve (a resolution for an image: the uv command line
with the image's packages as constraints, its output read, what would replace the image's torch said and fixed, the
packages that build against torch decided), read, launch, closure, plan (the local plan). The talking part:
resolver (runs uv on this machine, offline first, bounded by a timeout; it never blocks a launch).
"""
