"""`gpuops sandbox up|down|status`: the local sandbox host (the embedded default)."""
from __future__ import annotations

from typing import List, Optional

import typer

from .app import Group, JsonOpt, app, output, with_warnings

sandbox_app = typer.Typer(cls=Group, help="The local sandbox host: a real sshd on 127.0.0.1 with emulated GPUs. "
                               "Rehearse a run before paying for GPU time.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("up")
def up(
    gpu: str = typer.Option("h100-pcie", "--gpu", help="GPU model: h100-pcie, h100-sxm5 (alias h100-sxm), h200, a100, "
                                                      "rtx6000ada, b200, rtxpro6000, gh200, a10."),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=0, max=16, help="Number of emulated GPUs (default 1; "
                                       "with --slurm: per node, default 8)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port for sshd (default: a free one, kept across restarts)."),
    driver: str = typer.Option("570.148.08", "--driver", help="Driver version the emulated nvidia-smi reports."),
    cuda: str = typer.Option("12.8", "--cuda", help="CUDA version in the nvidia-smi header."),
    fail: str = typer.Option("none", "--fail", help="Emulate an nvidia-smi failure: none, driver-not-loaded, "
                                                    "version-mismatch, no-devices, gpu-lost, hang."),
    header: str = typer.Option("legacy", "--header", help="nvidia-smi header style: legacy ('CUDA Version') or "
                                                          "kmd (R610+: 'KMD Version', 'CUDA UMD Version')."),
    python: Optional[str] = typer.Option(None, "--python", help="Remote Python for the sandbox profile "
                                                                "(e.g. a venv with torch). Default: none written, "
                                                                "as for an instance: commands use python3, setup "
                                                                "makes ~/.venvs/gpuops from it."),
    image: Optional[str] = typer.Option(None, "--image", metavar="NAME",
                                        help="An emulated instance image: lambda-stack (python3 holds a CUDA torch "
                                             "2.9.0+cu128 and pip, as Lambda Stack's does). With --cloud: the image "
                                             "instances boot with. Default: this machine's python3.",
                                        show_default=False),
    cloud: bool = typer.Option(False, "--cloud", help="Start the local Lambda Cloud API emulator instead: "
                               "`gpuops up` launches sandbox hosts through it. Prints its URL and API key."),
    slurm: Optional[int] = typer.Option(None, "--slurm", metavar="N", min=1, max=16, help="Start a local Slurm "
                                        "cluster of N nodes instead (Debian's slurmctld, slurmd and munge; each "
                                        "node's GPUs emulated, --gpu and --gpus per node) and its login node, and "
                                        "write the profile 'slurm'."),
    boot_seconds: float = typer.Option(20.0, "--boot-seconds", help="With --cloud: how long instances stay "
                                       "'booting'."),
    launch_window: float = typer.Option(12.0, "--launch-window", help="With --cloud: at most one launch per this "
                                        "many seconds, else 429 (Lambda: 12)."),
    fault: Optional[List[str]] = typer.Option(None, "--fault", metavar="NAME[=VALUE][@GPU]", help=(
        "Inject a GPU fault (repeatable; on GPU 0 unless @GPU): ecc[=N] uncorrectable ECC errors, correctable-ecc[=N], "
        "remap-pending, remap-failure, recovery-action[=Reset], thermal, power-brake, pcie-x8[=WIDTH], "
        "persistence-off, mig, xid[=CODE] (a kernel-log line, default 79), kernel-log-unreadable, slow-smi[=MS] (every "
        "nvidia-smi call takes MS longer, default 300).")),
    json_: bool = JsonOpt,
) -> None:
    """Start the sandbox host (or change its emulated GPUs) and write the profile 'sandbox'.
    With --cloud: start the Lambda Cloud API emulator (see docs/sandbox.md). With --slurm N: a local Slurm cluster of
    N nodes and its login node, and the profile 'slurm' (--port: the login node's). --json: one document whose
    `warnings` list holds every warning (e.g. its port was taken and it moved to another)."""
    out = output(json_)
    if image is not None:
        from ..errors import UsageError
        from ..sandbox.image import IMAGES

        if image not in IMAGES:
            raise UsageError(f"--image {image!r}: unknown image; known: {', '.join(IMAGES)}")
    if cloud and slurm:
        from ..errors import UsageError

        raise UsageError("--cloud and --slurm start different things: give one")
    if cloud:
        return _cloud_up(out, json_, port or 0, boot_seconds, launch_window, python, image)
    if slurm:
        return _slurm_up(out, json_, slurm, gpu, 8 if gpus is None else gpus, port)
    from ..sandbox import host

    st = host.up(gpu=gpu, gpus=1 if gpus is None else gpus, port=port, driver=driver, cuda=cuda, fail=fail, header=header, python=python,
                 faults=fault or [], image=image)
    if st.get("port_moved_from"):
        out.warn(f"port {st['port_moved_from']} is taken by another program; the sandbox now listens on {st['port']} "
                 "(profile 'sandbox' updated)")
    if json_:
        out.emit_json(with_warnings({"running": True, "host": "127.0.0.1", "port": st["port"], "profile": "sandbox",
                                     "profile_path": str(host.profile_path()), "gpu": st["gpu"], "image": image}, out))
        return
    g = st["gpu"]
    what = "started" if st.get("started") else "running"
    out.success(f"sandbox host {what} on 127.0.0.1:{st['port']} ({g['count']}x {g['gpu']} emulated"
                f"{', failing: ' + g['fail'] if g.get('fail') else ''}"
                f"{', faults: ' + ', '.join(g['faults']) if g.get('faults') else ''}"
                f"{', image ' + image if image else ''})")
    out.info(f"profile 'sandbox' written to {host.profile_path()}")
    out.info("next: gpuops verify sandbox")


def _cloud_up(out, json_: bool, port: int, boot_seconds: float, launch_window: float, python, image=None) -> None:
    from ..cloud.emulator import daemon

    info, started = daemon.start(port=port, boot_seconds=boot_seconds, launch_window=launch_window, python=python,
                                 image=image)
    if json_:
        out.emit_json(with_warnings({"running": True, "url": info["url"], "api_key": info["api_key"],
                                     "user": info["user"], "dir": str(daemon.emulator_dir()), "image": image}, out))
        return
    out.success(f"Lambda API emulator {'started' if started else 'running'} on {info['url']}"
                + (f"; instances boot with the {image} image" if image else ""))
    out.info(f"instances are sandbox hosts on 127.0.0.N:22; log in as {info['user']} (Lambda's images: ubuntu)")
    out.print("use it from this shell (the key is the emulator's own, not a Lambda key):")
    out.print(f"export GPUOPS_LAMBDA_API_URL={info['url']}")
    out.print(f"export LAMBDA_API_KEY={info['api_key']}")
    out.print(f"export GPUOPS_CLOUD_SSH_USER={info['user']}")
    # a rehearsal asks its emulator every half second whether an instance is up, not every 5 s as Lambda is asked
    # (against Lambda the variable is ignored: cloud/instances.make_context)
    out.print(f"export GPUOPS_CLOUD_POLL_S={REHEARSAL_POLL_S:g}")
    out.info("next: gpuops cloud types; stop it (and every instance) with: gpuops sandbox down --cloud")


REHEARSAL_POLL_S = 0.5


def _slurm_up(out, json_: bool, nodes: int, gpu: str, gpus: int, port) -> None:
    from ..sandbox import slurm_login

    info = slurm_login.up(nodes, gpus_per_node=gpus, gpu=gpu, port=port)
    if json_:
        out.emit_json(with_warnings({"running": True, "profile": slurm_login.PROFILE_NAME,
                                     **{k: v for k, v in info.items() if k != "started"}}, out))
        return
    login = info["login"]
    out.success(f"local Slurm cluster {info['name']} {'started' if info['started'] else 'running'}: "
                f"{len(info['nodes'])} nodes ({','.join(info['nodes'])}), {info['gpus_per_node']}x {info['gpu']} "
                f"emulated each, partition {info['partition']}, Slurm {info['slurm_version']}")
    out.info(f"login node on {login['host']}:{login['port']}; shared folder {info['shared_dir']}")
    out.info(f"profile '{slurm_login.PROFILE_NAME}' written to {info['profile_path']}")
    out.print(f"use it from this shell: . {info['env_file']}   (then sinfo, sbatch, squeue ...)")
    out.info("stop it (and its jobs) with: gpuops sandbox down")


@sandbox_app.command("down")
def down(
    cloud: bool = typer.Option(False, "--cloud", help="Stop the Lambda API emulator and every instance it runs."),
    json_: bool = JsonOpt,
) -> None:
    """Stop the sandbox host and the jobs its sessions left running, detached ones too; only those: never the calling
    shell, its other processes, or anything that merely has GPUOPS_SANDBOX_DIR set. Keys, profile and home stay.
    The local Slurm cluster (`sandbox up --slurm N`) stops too, with its jobs and login node.
    --json: {"stopped", "slurm_stopped", "warnings"}."""
    out = output(json_)
    if cloud:
        from ..cloud.emulator import daemon

        stopped = daemon.stop()
        if json_:
            out.emit_json(with_warnings({"stopped": stopped}, out))
        elif stopped:
            out.success("Lambda API emulator stopped; its instances are terminated")
        else:
            out.info("Lambda API emulator was not running")
        return
    from ..sandbox import host, slurm_login

    stopped = host.down()
    slurm_stopped = slurm_login.down()
    if json_:
        out.emit_json(with_warnings({"stopped": stopped, "slurm_stopped": slurm_stopped}, out))
        return
    if stopped:
        out.success("sandbox host stopped")
    else:
        out.info("sandbox host was not running")
    if slurm_stopped:
        out.success("local Slurm cluster stopped (its jobs, daemons and login node)")


@sandbox_app.command("status")
def status(
    cloud: bool = typer.Option(False, "--cloud", help="The Lambda API emulator instead: its URL and instances."),
    json_: bool = JsonOpt,
) -> None:
    """Is the sandbox host running, where, and with which emulated GPUs. Exit 1 if not running (--json: always 0)."""
    out = output(json_)
    if cloud:
        return _cloud_status(out, json_)
    from ..sandbox import host

    st = host.status()
    if json_:
        out.emit_json(with_warnings(_status_doc(st), out))
        return
    if not st["running"]:
        out.print("sandbox host: not running (start it with: gpuops sandbox up)")
        raise typer.Exit(1)
    g = st.get("gpu", {})
    out.print(f"sandbox host: running on 127.0.0.1:{st['port']} (pid {st['pid']})")
    out.print(f"emulated GPUs: {g.get('count')}x {g.get('gpu')}, driver {g.get('driver')}, CUDA {g.get('cuda')}"
              f"{', failing: ' + g['fail'] if g.get('fail') else ''}"
              f"{', faults: ' + ', '.join(g['faults']) if g.get('faults') else ''}")
    out.print(f"directory: {st['dir']}")
    out.print(f"profile: {st['profile']}")


def _status_doc(st: dict) -> dict:
    """host.status() in docs/json.md's vocabulary: `host` (was `address`), `profile` a name with its file as
    `profile_path` (was `profile`, the path)."""
    doc = {("host" if k == "address" else k): v for k, v in st.items() if k != "profile"}
    if "profile" in st:
        doc["profile"], doc["profile_path"] = ("sandbox" if st["profile"] else None), st["profile"]
    return doc


def _cloud_status(out, json_: bool) -> None:
    import json
    import urllib.request

    from ..cloud.emulator import daemon

    info = daemon.read_info()
    if not info:
        if json_:
            out.emit_json(with_warnings({"running": False}, out))
            return
        out.print("Lambda API emulator: not running (start it with: gpuops sandbox up --cloud)")
        raise typer.Exit(1)
    req = urllib.request.Request(info["url"].rsplit("/api/v1", 1)[0] + "/_emulator/state",
                                 headers={"Authorization": f"Bearer {info['api_key']}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        st = json.loads(r.read())["data"]
    insts = [{k: v for k, v in i.items() if k in ("id", "status", "name")} | {"host": i.get("ip"),
                                                                            "type": i["instance_type"]["name"]}
             for i in st["instances"]]
    if json_:
        out.emit_json(with_warnings({"running": True, "url": info["url"], "user": info["user"], "instances": insts}, out))
        return
    out.print(f"Lambda API emulator: running on {info['url']} (pid {info['pid']})")
    for i in insts:
        out.print(f"  {i['id'][:12]}  {i['status']:<11} {i.get('host') or '-':<14} {i['type']}  {i.get('name') or ''}")
    if not insts:
        out.print("  no instances")
