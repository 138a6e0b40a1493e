"""`gpuops sandbox up|down|status`: the local sandbox host (the embedded default)."""
from __future__ import annotations

from typing import Optional

import typer

from .app import Group, JsonOpt, app, output

sandbox_app = typer.Typer(cls=Group, help="The local sandbox host: a real sshd on 127.0.0.1 with emulated GPUs. "
                               "Rehearse a run before paying for GPU time.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("up")
def up(
    gpu: str = typer.Option("h100-pcie", "--gpu", help="GPU model: h100-pcie, h100-sxm, a100, rtx6000ada."),
    gpus: int = typer.Option(1, "--gpus", min=0, max=16, help="Number of emulated GPUs."),
    port: Optional[int] = typer.Option(None, "--port", help="Port for sshd (default: a free one, kept across restarts)."),
    driver: str = typer.Option("570.148.08", "--driver", help="Driver version the emulated nvidia-smi reports."),
    cuda: str = typer.Option("12.8", "--cuda", help="CUDA version in the nvidia-smi header."),
    fail: str = typer.Option("none", "--fail", help="Emulate an nvidia-smi failure: none, driver-not-loaded, "
                                                    "version-mismatch, no-devices, gpu-lost, hang."),
    header: str = typer.Option("legacy", "--header", help="nvidia-smi header style: legacy ('CUDA Version') or "
                                                          "kmd (R610+: 'KMD Version', 'CUDA UMD Version')."),
    python: Optional[str] = typer.Option(None, "--python", help="Remote Python for the sandbox profile "
                                                                "(e.g. a venv with torch; default: python3)."),
    json_: bool = JsonOpt,
) -> None:
    """Start the sandbox host (or change its emulated GPUs) and write the profile 'sandbox'."""
    from ..sandbox import host

    out = output(json_)
    st = host.up(gpu=gpu, gpus=gpus, port=port, driver=driver, cuda=cuda, fail=fail, header=header, python=python)
    if json_:
        out.emit_json({"running": True, "port": st["port"], "profile": str(host.profile_path()), "gpu": st["gpu"]})
        return
    g = st["gpu"]
    if st.get("port_moved_from"):
        out.warn(f"port {st['port_moved_from']} is taken by another program; the sandbox now listens on {st['port']} "
                 "(profile 'sandbox' updated)")
    what = "started" if st.get("started") else "running"
    out.success(f"sandbox host {what} on 127.0.0.1:{st['port']} ({g['count']}x {g['gpu']} emulated"
                f"{', failing: ' + g['fail'] if g.get('fail') else ''})")
    out.info(f"profile 'sandbox' written to {host.profile_path()}")
    out.info("next: gpuops verify sandbox")


@sandbox_app.command("down")
def down(json_: bool = JsonOpt) -> None:
    """Stop the sandbox host and the jobs its sessions left running (keys, profile and its home stay)."""
    from ..sandbox import host

    out = output(json_)
    stopped = host.down()
    if json_:
        out.emit_json({"stopped": stopped})
    elif stopped:
        out.success("sandbox host stopped")
    else:
        out.info("sandbox host was not running")


@sandbox_app.command("status")
def status(json_: bool = JsonOpt) -> None:
    """Is the sandbox host running, where, and with which emulated GPUs. Exit 1 if not running (--json: always 0)."""
    from ..sandbox import host

    out = output(json_)
    st = host.status()
    if json_:
        out.emit_json(st)
        return
    if not st["running"]:
        out.print("sandbox host: not running (start it with: gpuops sandbox up)")
        raise typer.Exit(1)
    g = st.get("gpu", {})
    out.print(f"sandbox host: running on 127.0.0.1:{st['port']} (pid {st['pid']})")
    out.print(f"emulated GPUs: {g.get('count')}x {g.get('gpu')}, driver {g.get('driver')}, CUDA {g.get('cuda')}"
              f"{', failing: ' + g['fail'] if g.get('fail') else ''}")
    out.print(f"directory: {st['dir']}")
    out.print(f"profile: {st['profile']}")
