"""`gpuops verify [NAME]`: is the remote GPU stack what the profile expects?"""
from __future__ import annotations

from typing import Optional

import typer

from .completion import profile_names
from .app import HostOpt, JsonOpt, ProfileOpt, app, output, pick_profile


@app.command()
def verify(
    name: Optional[str] = typer.Argument(None, help="Profile name (e.g. lambda-h100, sandbox).", show_default=False,
                                          autocompletion=profile_names),
    profile: Optional[str] = ProfileOpt,
    playbook: Optional[str] = typer.Option(None, "--playbook", help="Playbook YAML (default: ./playbooks/verify.yaml, "
                                                                    "else the built-in one)."),
    json_: bool = JsonOpt,
    no_save: bool = typer.Option(False, "--no-save", help="Do not save the report under logs/env_checks/."),
    no_cuda: bool = typer.Option(False, "--no-cuda-check", help="Skip the CUDA tensor test (faster on busy GPUs)."),
    fail_on_warn: bool = typer.Option(False, "--fail-on-warn", help="Exit 1 on warnings too (for CI gates)."),
    bench: bool = typer.Option(False, "--bench", help="Also measure each GPU (bf16 matmul, device copy, ~1-2 s each; "
                                                      "NCCL all-reduce on several GPUs, judged by GPU model, count "
                                                      "and message size) against its reference speed."),
    host: Optional[int] = HostOpt,
    alloc_wait: int = typer.Option(20, "--alloc-wait", metavar="SECONDS", min=1, max=3600,
                                   help="Slurm profiles: how long the verify step may wait for its nodes (srun "
                                        "--immediate) before verify says the partition has no free nodes."),
) -> None:
    """Check GPUs (identity and health: ECC, row remapping, throttling, PCIe link, Xid), driver, CUDA, Python and
    packages in one remote execution; report pass/warn/fail with fixes. --bench also measures each GPU's speed.
    Rules from playbooks/rules.yaml (Megatron + numpy 2, torch kernels for the GPU, ...); opt-in checks by name
    with the profile's `checks: [vllm, apex]`.
    A fleet profile (hosts:) is verified on every host in parallel, then as a whole.
    A Slurm profile (`slurm:`, its host the login node) is verified through Slurm (docs/slurm.md): the partition and
    its nodes' states (a drained node with Slurm's reason and the --exclude fix), then the probe on every node in one
    srun step, each node's report and the same stack across them."""
    from ..verify import host as core

    out = output(json_)
    prof = pick_profile(name, profile)
    opts = dict(playbook=playbook, save=not no_save, cuda_check=not no_cuda, fail_on_warn=fail_on_warn, bench=bench)
    if prof.slurm is not None:
        from ..errors import UsageError
        from ..slurm.verify_cluster import run_cluster_verify

        if host is not None:
            raise UsageError("--host is for a fleet's hosts; a Slurm profile's nodes are Slurm's: set slurm.nodelist "
                             "(or slurm.exclude) in the profile")
        raise typer.Exit(run_cluster_verify(prof, out, wait_s=alloc_wait, **opts))
    if prof.is_fleet and host is None:
        code = core.run_fleet_verify(prof, out, **opts)
    else:
        code = core.run_verify(prof.node(host), out, **opts)
    raise typer.Exit(code)
