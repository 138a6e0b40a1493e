"""Setup's failure summary (issue 34): patterns matched on whole lines, then shortened as printed; known causes name
the package and the cause (knowledge.yaml setup_causes). Recorded outputs of pip and uv."""
from __future__ import annotations

from gpuops.setup import failure
from gpuops.setup.apply import _failure
from gpuops.profiles.model import Profile
from support.setup_facts import KNOW

# pip 25 building flash-attn from its sdist in an isolated environment (OpenRLHF's requirements.txt on Lambda Stack)
PIP_BUILD = """\
Collecting deepspeed==0.19.5 (from -r requirements.txt (line 3))
  Using cached deepspeed-0.19.5.tar.gz (1.6 MB)
  Preparing metadata (setup.py): finished with status 'done'
Collecting flash-attn==2.8.3 (from -r requirements.txt (line 2))
  Downloading flash_attn-2.8.3.tar.gz (8.4 MB)
  Installing build dependencies: started
  Installing build dependencies: finished with status 'done'
  Getting requirements to build wheel: started
  Getting requirements to build wheel: finished with status 'error'
  error: subprocess-exited-with-error
  × Getting requirements to build wheel did not run successfully.
  │ exit code: 1
  ╰─> [17 lines of output]
      Traceback (most recent call last):
        File "<string>", line 22, in <module>
      ModuleNotFoundError: No module named 'torch'
      [end of output]
  note: This error originates from a subprocess, and is likely not a problem with pip.
error: subprocess-exited-with-error
× Getting requirements to build wheel did not run successfully.
│ exit code: 1
╰─> See above for output.
note: This error originates from a subprocess, and is likely not a problem with pip.""".splitlines()

# uv pip install of the same
UV_BUILD = """\
Resolved 12 packages in 1.20s
  × Failed to build `flash-attn==2.8.3`
  ├─▶ The build backend returned an error
  ╰─▶ Call to `setuptools.build_meta:__legacy__.build_wheel` failed (exit status: 1)
      [stderr]
      ModuleNotFoundError: No module named 'torch'
      hint: This usually indicates a problem with the package or the build environment.""".splitlines()

# pip against an index whose name does not resolve: the cause is past character 200 of the retry warning
RETRY = ("WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection "
         "broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f3c2a1b2d10>: "
         "Failed to establish a new connection: [Errno -2] Name or service not known')': /simple/torch/")
PIP_DNS = ["Looking in indexes: https://user:s3cret@pypi.corp.example/simple", RETRY, RETRY,
           "ERROR: Could not find a version that satisfies the requirement torch (from versions: none)",
           "ERROR: No matching distribution found for torch",
           "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/"]


def test_a_build_without_torch_names_the_package_and_the_cause():
    for output in (PIP_BUILD, UV_BUILD):
        cause, fix = failure.known_cause(output, KNOW["setup_causes"])
        assert cause.startswith("flash-attn builds against torch, and the installer built it in an isolated "
                                "environment that has no torch")
        assert "flash-attn after torch with --no-build-isolation" in fix


def test_an_unreachable_index_is_found_past_character_200_and_named_without_credentials():
    assert RETRY.index("Name or service not known") > 200
    cause, fix = failure.known_cause(PIP_DNS, KNOW["setup_causes"])
    assert cause.startswith("the host could not reach pypi.corp.example")
    assert "s3cret" not in cause + fix
    line = failure.telling_line(PIP_DNS, KNOW["setup_error_lines"])
    assert "Name or service not known" in line and len(line) <= failure.SHOWN + 6
    assert line.startswith("...") and "ResolutionImpossible" not in line


def test_shorten_keeps_what_matched_in_view():
    long = "x" * 500 + " the cause " + "y" * 500
    short = failure.shorten(long, long.index("the cause"))
    assert "the cause" in short and short.startswith("...") and short.endswith("...")
    assert failure.shorten("short line") == "short line"


def test_the_summary_says_the_known_cause_and_its_fix():
    prof = Profile(host="h", python="~/v/bin/python")
    tail = [failure.kept(t) for t in PIP_BUILD]
    exc = _failure(prof, {"rc": 1, "failed_step": "deps"}, "~/p/.gpuops/setup", tail, KNOW["setup_error_lines"],
                   KNOW["setup_causes"])
    assert "setup failed on" in exc.message and "at step deps (exit 1): flash-attn builds against torch" in exc.message
    assert exc.hint.startswith("install flash-attn after torch with --no-build-isolation")
    assert "See above for output" in exc.message  # among its last lines, as they are: no longer the only word
