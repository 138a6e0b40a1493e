"""`gpuops ssh`: a shell, a command or port forwards on a profile's host (parses and calls remote.interactive)."""
from __future__ import annotations

from typing import List, Optional

import typer
import typer.core

from .app import ProfileOpt, app, output, pick_profile
from .completion import profile_names


class _DashDash(typer.core.TyperCommand):
    """Remembers how many words came after `--`: `gpuops ssh -- nvidia-smi` has no profile, `gpuops ssh h100 --
    nvidia-smi` has one (click gives both as plain arguments)."""

    def parse_args(self, ctx, args):
        ctx.meta["gpuops.after_dashdash"] = len(args) - args.index("--") - 1 if "--" in args else 0
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx):
        return ["[OPTIONS]", "[PROFILE]", "[-- COMMAND...]"]


@app.command("ssh", cls=_DashDash)
def ssh(
    ctx: typer.Context,
    words: Optional[List[str]] = typer.Argument(None, metavar="PROFILE -- COMMAND", show_default=False,
                                                autocompletion=profile_names,
                                                help="The profile (default as for every command), then after -- a "
                                                     "command to run instead of a shell."),
    profile: Optional[str] = ProfileOpt,
    local: List[str] = typer.Option([], "-L", metavar="[LOCAL:]REMOTE",
                                    help="Forward this machine's 127.0.0.1:LOCAL to the host's 127.0.0.1:REMOTE "
                                         "(TensorBoard, Jupyter, a vLLM server); LOCAL defaults to REMOTE. "
                                         "Repeatable."),
    forward_only: bool = typer.Option(False, "-N", help="Forward ports only: no shell, no command (Ctrl-C ends it)."),
    tty: bool = typer.Option(False, "-t", help="A terminal for the command (top, htop, a REPL)."),
    node: Optional[int] = typer.Option(None, "--node", "--host", metavar="N", min=0, show_default=False,
                                       help="Host N of a fleet profile (0 = rank 0, the default)."),
) -> None:
    """A shell on the profile's host with its key, user and port and gpuops' own known_hosts (a host key that
    changed is refused, exit 3); or a command after --, whose exit code becomes gpuops' own; -L forwards ports.

    gpuops ssh h100 · gpuops ssh h100 -- nvidia-smi · gpuops ssh -L 6006 -N · gpuops ssh -L 8000:8888"""
    from ..errors import UsageError
    from ..remote import interactive

    words = list(words or [])
    before = len(words) - ctx.meta.get("gpuops.after_dashdash", 0)
    names, command = words[:before], words[before:]
    if len(names) > 1:
        raise UsageError(f"one profile at most, got {' '.join(names)}",
                         hint="a command goes after --: gpuops ssh PROFILE -- " + " ".join(names[1:]))
    if forward_only and command:
        raise UsageError("-N forwards ports only: it takes no command", hint="drop -N, or the command after --")
    if forward_only and not local:
        raise UsageError("-N without -L forwards nothing", hint="gpuops ssh -L 6006 -N")
    forwards = interactive.unique([interactive.forward(x) for x in local])
    for f in forwards:  # known here: said before connecting, as ssh would only say it after
        if interactive.local_port_taken(f.local):
            raise UsageError(f"this machine's 127.0.0.1:{f.local} is already in use (another tunnel, a server)",
                             hint=f"choose another local port: -L {f.local + 1}:{f.remote}")
    out = output()
    prof = pick_profile(names[0] if names else None, profile, out).node(node, "--node")
    argv = interactive.ssh_argv(prof, forwards=forwards, forward_only=forward_only, command=command, tty=tty)

    def said() -> None:  # once the host key, the key and the host are judged: never a line a refusal contradicts
        for f in forwards:
            out.info(f"forwarding http://127.0.0.1:{f.local} → {prof.host}'s 127.0.0.1:{f.remote}"
                     + (" (Ctrl-C ends it)" if forward_only else ""))

    code = interactive.session(prof, argv, announce=out.info, on_ready=said)
    raise typer.Exit(code)
