"""The pure half of the resolution (issue 34): images.yaml's rows, the uv command lines, what uv printed read back
(recorded outputs), the judgement, the packages that build against torch."""
from __future__ import annotations

from gpuops.project import builds, images, uvcmd
from gpuops.project.resolution import Resolution, judge, relax_for
from gpuops.project.uvcmd import Outcome, ResolveRequest

DOC = images.load()
L22 = images.image_for(DOC, "lambda-stack-22-04")
DRIVERS = [{"cuda": "13.0", "toolkit": "580.65.06", "minor_compat": "580.65.06"},
           {"cuda": "12.8", "toolkit": "570.26", "minor_compat": "525.60.13"}]


def pylock(*packages: tuple[str, str, int | None, str]) -> str:
    """A pylock.toml as `uv pip compile --format pylock.toml` writes it: (name, version, size, wheel file name)."""
    out = 'lock-version = "1.0"\ncreated-by = "uv"\nrequires-python = ">=3.10"\n'
    for name, version, size, wheel in packages:
        sized = f", size = {size}" if size is not None else ""
        out += (f'\n[[packages]]\nname = "{name}"\nversion = "{version}"\nindex = "https://pypi.org/simple"\n'
                f'wheels = [{{ url = "https://files.example/{wheel}", upload-time = 2025-10-15T00:00:00Z{sized}, '
                f'hashes = {{ sha256 = "00" }} }}]\n')
    return out


def test_images_yaml_rows():
    assert L22.python == "3.10.12" and L22.platform == "x86_64-manylinux_2_35"
    assert L22.packages["torch"] == "2.9.0+cu128" and L22.keep == {"torch"} and L22.cuda == "12.8"
    assert {"numpy", "requests"} <= L22.unconfirmed and "torch" not in L22.unconfirmed
    assert all(L22.sources[n] for n in L22.packages)  # every row says where it comes from
    gh = images.image_for(DOC, "lambda-stack-24-04", "aarch64")
    assert gh.arch == "arm64" and gh.platform == "aarch64-manylinux_2_39" and gh.label.endswith("(arm64)")
    assert [i.name for i in images.launched(DOC)] == ["lambda-stack-22-04", "lambda-stack-24-04"]
    on_purpose = L22.with_packages({"torch": "2.10.0"})
    assert on_purpose.packages["torch"] == "2.10.0" and "torch" in on_purpose.keep


def test_the_uv_command_for_the_image():
    request = ResolveRequest(("torchvision",), ("--extra-index-url https://download.pytorch.org/whl/cu128",))
    run = uvcmd.compile_run("constrained", request, L22, constrained=True, stub_urls={"torch": "file:///s/t.whl"},
                            python="/usr/bin/python3")
    argv = run.argv
    assert argv[:2] == ["pip", "compile"] and argv[-1] == "requirements.in"
    assert argv[argv.index("--python-version") + 1] == "3.10.12"
    assert argv[argv.index("--python-platform") + 1] == "x86_64-manylinux_2_35"
    assert argv[argv.index("--index-strategy") + 1] == "unsafe-best-match"  # pip's way with an extra index
    assert run.files["constraints.txt"] == "torch @ file:///s/t.whl\n"
    assert run.files["requirements.in"] == "--extra-index-url https://download.pytorch.org/whl/cu128\ntorchvision\n"
    assert 'name = "numpy"\nversion = "1.21.5"' in run.files["pylock.constrained.toml"]  # preferred, not kept
    free = uvcmd.compile_run("unconstrained", request, L22, constrained=False)
    assert "--constraint" not in free.argv and "constraints.txt" not in free.files


def test_pylock_sizes_are_those_of_the_wheel_the_machine_takes():
    text = pylock(("torch", "2.14.1", 900_000_000, "torch-2.14.1-cp310-cp310-manylinux_2_28_x86_64.whl"))
    text = text.replace("hashes", 'hashes = { sha256 = "00" } }, { url = "https://files.example/torch-2.14.1-cp310-'
                                  'cp310-manylinux_2_28_aarch64.whl", size = 700000000, hashes', 1)
    assert uvcmd.parse_pylock(text, "x86_64")["torch"][:2] == ("2.14.1", 900_000_000)
    assert uvcmd.parse_pylock(text, "arm64")["torch"][:2] == ("2.14.1", 700_000_000)


def test_uv_errors_told_apart():
    offline = Outcome(1, stderr="error: No solution found when resolving dependencies\n  cause: Because torch was "
                                "not found in the cache and you require torch, we can conclude ...\n\nhint: Packages "
                                "were unavailable because the network was disabled.")
    assert uvcmd.classify(offline) == "offline-miss"
    dns = Outcome(2, stderr="error: Request failed after 3 retries\n  cause: Failed to fetch: https://x/simple/t/\n  "
                            "cause: dns error\n  cause: failed to lookup address information: Name or service not "
                            "known", online=True)
    assert uvcmd.classify(dns) == "network"
    assert uvcmd.classify(Outcome(None)) == "timeout" and uvcmd.classify(Outcome(0)) == "ok"
    conflict = Outcome(1, stderr="warning: The requested Python version 3.10 is not available\nerror: No solution "
                                 "found when resolving dependencies\n  cause: Because you require torch==2.10 and "
                                 "torch==2.9.0, we can conclude that\n         your requirements are unsatisfiable.\n"
                                 "\nhint: something", online=True)
    assert uvcmd.classify(conflict) == "no-solution"
    assert uvcmd.uv_cause(conflict.stderr) == ("Because you require torch==2.10 and torch==2.9.0, we can conclude "
                                               "that your requirements are unsatisfiable.")


def test_relaxing_frees_the_requirements_uv_names():
    request = ResolveRequest(("numpy>=1.20", "bigtrainer[extra]>=2 ; python_version >= '3.8'"), ())
    stderr = "  cause: Because bigtrainer>=2.0.0 depends on torch>=2.11 and you require bigtrainer>=2, ..."
    assert relax_for(request, L22, stderr) == ("numpy>=1.20", "bigtrainer[extra] ; python_version >= '3.8'")
    assert relax_for(ResolveRequest(("bigtrainer",), ()), L22, stderr) is None  # nothing left to free


def test_judge_fixes_and_says_what_pip_alone_would_do():
    constrained = Outcome(0, output=pylock(
        ("torch", "2.9.0+cu128", None, "torch-2.9.0+cu128-py3-none-any.whl"),
        ("torchvision", "0.24.0", 8_000_000, "torchvision-0.24.0-cp310-cp310-manylinux_2_28_x86_64.whl"),
        ("numpy", "1.21.5", 16_000_000, "numpy-1.21.5-cp310-cp310-manylinux_2_17_x86_64.whl")))
    alone = Outcome(0, output=pylock(
        ("torch", "2.14.1", 900_000_000, "torch-2.14.1-cp310-cp310-manylinux_2_28_x86_64.whl"),
        ("torchvision", "0.29.2", 8_000_000, "torchvision-0.29.2-cp310-cp310-manylinux_2_28_x86_64.whl"),
        ("nvidia-cuda-runtime", "13.0.96", 2_100_000_000, "nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_27_"
                                                          "x86_64.whl"),
        ("numpy", "1.21.5", 16_000_000, "numpy-1.21.5-cp310-cp310-manylinux_2_17_x86_64.whl")))
    r = judge(ResolveRequest(("torch", "torchvision"), ()), L22, {"constrained": constrained, "unconstrained": alone},
              [], DRIVERS)
    assert isinstance(r, Resolution) and r.available and r.refusal is None
    assert r.packages == {"torchvision": "0.24.0"} and r.install_bytes == 8_000_000
    assert r.replaces_image == [("torch", "2.9.0+cu128", "2.14.1")]
    assert r.fixes[-1] == ("pip alone would install torch 2.14.1 with CUDA 13.0 libraries (3.01 GB) over the image's "
                           "torch 2.9.0+cu128, which it would shadow (CUDA 13.0 needs driver 580 or newer); the plan's "
                           "pins keep the image's")
    assert r.to_dict()["pins"]["torch"] == "2.9.0+cu128"


def test_judge_without_a_resolution_never_refuses():
    for outcome in (Outcome(None, seconds=20.0), Outcome(2, stderr="error: Request failed after 3 retries\n  cause: "
                                                                    "tcp connect error", online=True)):
        r = judge(ResolveRequest(("torch",), ()), L22, {"constrained": outcome}, [], DRIVERS)
        assert not r.available and r.refusal is None and r.why


def test_builds_decided_from_the_rows():
    rows = [{"name": "flash-attn", "wheel": "https://w/v{version}/fa-{version}+cu{cuda_major}torch{torch_mm}"
                                            "cxx11abi{abi}-{py}-{py}-linux_{machine}.whl",
             "build": "no-build-isolation", "env": {"MAX_JOBS": "4"}},
            {"name": "xformers", "index_wheels": True, "build": "no-build-isolation"},
            {"name": "deepspeed", "build": "isolated", "source": "its setup.py needs no torch; ops at first use"}]
    resolved = {"flash-attn": ("2.8.3", None, "https://f/flash_attn-2.8.3.tar.gz"),
                "xformers": ("0.0.32", None, "https://f/xformers-0.0.32-cp39-abi3-manylinux_2_28_x86_64.whl"),
                "deepspeed": ("0.19.5", None, "https://f/deepspeed-0.19.5.tar.gz"), "six": ("1.17.0", None, "")}
    got = {b["name"]: b for b in builds.decide(resolved, L22, rows)}
    assert set(got) == {"flash-attn", "xformers", "deepspeed"}
    assert got["flash-attn"]["url"] == "https://w/v2.8.3/fa-2.8.3+cu12torch2.9cxx11abiTRUE-cp310-cp310-linux_x86_64.whl"
    assert got["xformers"]["how"] == "index-wheel" and got["deepspeed"]["how"] == "isolated"
    # an image whose torch is not known: no wheel to name, a build against the environment's torch
    bare = images.image_for(DOC, "lambda-stack-24-04")
    fa = builds.decide({"flash-attn": ("2.8.3", None, "")}, bare, rows)[0]
    assert fa["how"] == "no-build-isolation" and "--no-build-isolation against the environment's torch" in fa["why"]
