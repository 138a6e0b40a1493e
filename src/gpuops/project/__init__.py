"""What a project needs, judged on this machine before anything is launched (issue 34).

Pure: images (what an image brings: playbooks/images.yaml), resolution (a resolution for an image: the uv command line
with the image's packages as constraints, its output read, what would replace the image's torch said and fixed, the
packages that build against torch decided), read (the dependency files: requirements with includes and index
lines, pyproject, setup.py by ast, PEP 723 blocks), launch (what the launch line runs: every script it reaches),
closure (the import closure at any depth), needs (launch + closure: what a job needs; the gate asks the host for it),
judge and plan (the local plan: the verdict, refusals with their fixes), verdict (the plan said and enforced),
gatefix (the launch gate's fix for a module the host cannot import). The talking part:
uvrun (runs uv on this machine, offline first, bounded by a timeout; it never blocks a launch).
"""
