"""What setup reads of a project: gpuops.project.read (issue 34 gathered the reading of a project in one capability,
which `run`, `train` and `setup` all ask). The names setup's modules import are kept here."""
from __future__ import annotations

from ..project.read import (Project, Req, ToolProject, installs_itself, marker_env,  # noqa: F401
                            names_extra_index, normalize, parse_pyproject, parse_requirements, python_meets,
                            read_project, requires_python, tool_project, tool_refusal)
from ..project.read import normalize as _norm  # noqa: F401
