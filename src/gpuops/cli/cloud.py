"""Lambda Cloud commands: `gpuops cloud types|keys`, `gpuops up`, `ls`, `down`, `reap` (docs/cloud.md).

typer only at import: httpx, the client and the ledger are imported inside the commands."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .app import Group, JsonOpt, app, output
from .fs import fs_question

cloud_app = typer.Typer(cls=Group, help="Lambda Cloud account: instance types with prices and capacity, SSH keys. "
                                        "Launch with `gpuops up`, list with `gpuops ls`.\n\n"
                                        "The API key: LAMBDA_API_KEY, else ./.env, else ~/.lambda_cloud/lambda_keys "
                                        "(api_key = ...). A file holding it that others can read is refused (exit 3, "
                                        "chmod 600); a key with a line break or non-ASCII character inside is refused "
                                        "(exit 2). It is never printed (docs/cloud.md).", no_args_is_help=True)
app.add_typer(cloud_app, name="cloud")


# what to launch: `up` and `run` take the same options (cloud/decisions.want_from checks them)
TypeOpt = typer.Option([], "--type", "-t", metavar="TYPE", help="Instance type, e.g. gpu_1x_h100_pcie (gpuops cloud "
                       "types; any case). Repeatable: tried in that order.", show_default=False)
GpuOpt = typer.Option(None, "--gpu", metavar="NAME[:COUNT]", help="Instead of --type: any type with COUNT (default 1) "
                      "of this GPU, cheapest first, e.g. H100 (SXM5 or PCIe), H100:8, 'A100 80GB:8', GH200 "
                      "(playbooks/gpus.yaml).", show_default=False)
MaxPriceOpt = typer.Option(None, "--max-price", metavar="USD", help="Leave out types above this price per hour "
                           "(per instance).", show_default=False)
WaitForCapacityOpt = typer.Option(None, "--wait-for-capacity", metavar="DURATION", help="When no type has capacity, "
                                  "keep re-reading it this long (30-60 s, growing to 4 min between reads), one line "
                                  "per read saying what it waits for and since when (default: fail at once).",
                                  show_default=False)


def _context(out, *, with_key: bool = False):
    from ..cloud.instances import make_context

    return make_context(out, with_key=with_key, project_dir=Path.cwd())


def _ask(question: str) -> bool:
    import sys

    if not sys.stdin.isatty():
        return True
    print(question + " [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _profile_label(row: dict) -> str:
    """ls' PROFILE column: the profile, and a fleet node's rank (pair#1)."""
    name = row["profile"] or "-"
    return f"{name}#{row['node']}" if row.get("node") is not None else name


def _money(v) -> str:
    return "-" if v is None else f"${v:,.2f}"


# -- cloud types / keys ---------------------------------------------------------------------------------------------
@cloud_app.command("types")
def types_(
    available: bool = typer.Option(False, "--available", help="Only types with capacity in some region now: what a "
                                                             "launch with the same options would try, in order."),
    gpu: Optional[str] = typer.Option(None, "--gpu", metavar="NAME[:COUNT]", help="Only types with COUNT (default 1) "
                                      "of this GPU, as `up --gpu` takes it: H100:8, A100, 'A100 80GB:8' "
                                      "(names from playbooks/gpus.yaml).", show_default=False),
    type_: List[str] = typer.Option([], "--type", "-t", metavar="TYPE", help="Only these types, in this order "
                                    "(repeatable), as `up --type` tries them.", show_default=False),
    max_price: Optional[float] = typer.Option(None, "--max-price", metavar="USD", help="Only types at or under this "
                                              "price per hour.", show_default=False),
    region: List[str] = typer.Option([], "--region", "-r", help="Only these regions, in this order (repeatable).",
                                     show_default=False),
    json_: bool = JsonOpt,
) -> None:
    """Instance types with their GPUs, price per hour and the regions with capacity now, in the order `up` and `run`
    would try them with the same options: cheapest first (or the --type order given); `#` numbers that order. Types
    the options leave out (over --max-price, no price) are listed after, with why."""
    from ..cloud import decisions as d

    out = output(json_)
    want = d.want_from(types=type_, gpu=gpu, max_price=max_price, regions=region, need_one=False,
                       project_dir=Path.cwd())
    ctx = _context(out)
    with ctx.client:
        avail = ctx.client.instance_types()
    choice = d.choose(avail, want, project_dir=Path.cwd())
    by_name = {a.type.name: a.type for a in avail.values()}
    rows = []
    for c in choice.candidates:
        if available and not c.regions:
            continue
        rows.append({"order": len(rows) + 1, **by_name[c.name].to_dict(), "gpu": c.gpu, "gpu_name": c.gpu_name,
                     "gpu_count": c.gpus, "regions_with_capacity": list(c.regions)})
    left_out = [{"name": n, "price_per_hour": p, "why": why} for n, p, why in choice.excluded]
    if not avail:  # `data: null` or an empty map: not "nothing matches"
        out.warn("the Lambda API listed no instance types at all (GET /instance-types answered no data)")
    if json_:
        out.emit_json({"instance_types": rows, "left_out": left_out})
        return
    if rows:
        out.print(f"{'#':>2} {'TYPE':<28} {'GPUS':>4} {'GPU':<26} {'VCPU':>4} {'RAM GiB':>7} {'$/HOUR':>8}  CAPACITY NOW")
    for r in rows:
        out.print(f"{r['order']:>2} {r['name']:<28} {r['gpus']:>4} {r['gpu_description'][:26]:<26} {r['vcpus']:>4} "
                  f"{r['memory_gib']:>7} {r['price_per_hour']:>8.2f}  {', '.join(r['regions_with_capacity']) or '-'}")
    if not rows and avail:
        out.print("no instance type has capacity now" if available and choice.candidates else
                  "no instance type matches")
    for x in left_out:
        out.print(f"not tried: {x['name']} (${x['price_per_hour']:.2f}/h): {x['why']}")


@cloud_app.command("keys")
def keys(
    add: Optional[Path] = typer.Option(None, "--add", help="Register this public key (or the .pub of a private key) "
                                                          "as gpuops-<fingerprint>, unless its content is there.",
                                       show_default=False),
    json_: bool = JsonOpt,
) -> None:
    """The account's SSH keys (name, type, fingerprint); `gpuops up` registers the profile's key itself when missing."""
    from ..cloud import decisions as d
    from ..cloud.keys import ensure_ssh_key, public_key_of
    from ..errors import UsageError

    out = output(json_)
    ctx = _context(out)
    with ctx.client:
        if add is not None:
            add = add.expanduser()
            if not add.is_file():
                raise UsageError(f"key file not found: {add}")
            line = add.read_text().strip() if add.suffix == ".pub" else public_key_of(add)
            name = ensure_ssh_key(ctx.client, line, out)
            out.info(f"key on the account as {name}")
        ks = ctx.client.ssh_keys()
    rows = []
    for k in ks:
        try:
            fp = d.fingerprint(k.public_key)
        except Exception:
            fp = "?"
        rows.append({"id": k.id, "name": k.name, "type": k.public_key.split()[0] if k.public_key else "?",
                     "fingerprint": fp})
    if json_:
        out.emit_json({"ssh_keys": rows})
        return
    if not rows:
        out.print("no SSH keys on the account (gpuops cloud keys --add ~/.ssh/id_ed25519.pub)")
    for r in rows:
        out.print(f"{r['name']:<32} {r['type']:<12} {r['fingerprint']}")


# -- up / ls / down / reap ---------------------------------------------------------------------------------------
@app.command("up")
def up(
    name: str = typer.Argument(..., help="Profile name to write (user config folder); every command then works on it."),
    type_: List[str] = TypeOpt,
    gpu: Optional[str] = GpuOpt,
    max_price: Optional[float] = MaxPriceOpt,
    region: List[str] = typer.Option([], "--region", "-r", help="Region to try, in order (repeatable; default: every "
                                                                "region listing capacity for the type)."),
    wait_for_capacity: Optional[str] = WaitForCapacityOpt,
    ttl: Optional[str] = typer.Option(None, "--ttl", metavar="DURATION", help="Time to live, e.g. 8h (above 0, at most "
                                      "365d), counted from the launch request and recorded before it (ledger and the "
                                      "instance's tags): after it every command warns, `gpuops ls` says so loudly and "
                                      "`gpuops reap` (from any machine of the account) terminates.",
                                      show_default=False),
    idle: Optional[str] = typer.Option(None, "--idle", metavar="DURATION", help="Idle limit: no gpuops run and GPU "
                                       "utilisation under 5 % for this long (above 0).", show_default=False),
    fs: List[str] = typer.Option([], "--fs", metavar="NAME", help="Lambda filesystem to attach (repeatable): only its "
                                 "region is tried; a missing one is created after asking (--yes: at once); the job "
                                 "sees GPUOPS_FS, setup's caches live on it (docs/fs.md).", show_default=False),
    key: Optional[Path] = typer.Option(None, "--key", help="Private SSH key (default: ~/.ssh/id_ed25519); its public "
                                                          "half is registered on the account when missing.",
                                       show_default=False),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip `gpuops verify` once SSH answers."),
    keep_on_failure: bool = typer.Option(False, "--keep-on-failure", help="Keep the instance when bring-up or verify "
                                                                          "fails (default: terminate it)."),
    timeout: Optional[str] = typer.Option(None, "--timeout", metavar="DURATION", help="Readiness deadline (default: "
                                          "20m, 35m for 8-GPU types).", show_default=False),
    trust_new: bool = typer.Option(False, "--trust-new", help="If the instance presents a host key other than the "
                                                              "pinned one, trust it (fingerprint printed)."),
    guard: Optional[str] = typer.Option(None, "--guard", metavar="on-instance", help="on-instance: install a watchdog "
                                        "that terminates the instance at the TTL/idle limit even with your laptop "
                                        "closed (puts your account-wide API key on the instance).", show_default=False),
    nodes: int = typer.Option(1, "--nodes", min=1, max=64, help="Launch N instances in one region and write "
                                                                      "a fleet profile (hosts:, rank 0 first) for "
                                                                      "torchrun/Ray; down NAME ends them all."),
    from_: Optional[str] = typer.Option(None, "--from", metavar="PROFILE", help="Carry PROFILE's settings (python, "
                                        "remote_dir, expect, setup, env_preset, env, secrets, fetch, sync) into the "
                                        "new profile; its host part comes from the launch.", show_default=False),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before launching."),
    json_: bool = JsonOpt,
) -> None:
    """Launch a Lambda instance (or --nodes N of them, a fleet), wait until it answers SSH (host key pinned before
    the first connection), write the profile NAME and verify it. The type: --type (several: tried in order) or --gpu
    NAME[:COUNT] (any type with it, cheapest first), none above --max-price, across the regions (gpuops cloud types
    with the same options shows the order). Prints the price per hour and asks first (unless --yes or not a
    terminal). NAME is reserved in the ledger before the launch: a second `up NAME` meanwhile is
    refused (exit 2). Ctrl-C, SIGTERM and SIGHUP terminate what was launched."""
    from ..cloud import decisions as d
    from ..cloud.instances import UpSpec
    from ..cloud.keys import require_key
    from ..cloud.managed import template_for
    from ..cloud.up import up as do_up
    from ..errors import UsageError
    from ..interrupts import as_interrupt

    out = output(json_)
    if guard not in (None, "on-instance"):
        raise UsageError(f"--guard {guard!r}: the only guard is 'on-instance'")
    if guard and not (ttl or idle):
        raise UsageError("--guard on-instance needs --ttl or --idle")
    keyfile = (key or Path("~/.ssh/id_ed25519")).expanduser()
    require_key(keyfile, given=key is not None)
    spec = UpSpec(name=name, types=list(type_), gpu=gpu, max_price=max_price, key=keyfile, regions=list(region),
                  wait_for_capacity_s=d.parse_duration(wait_for_capacity) if wait_for_capacity else 0.0,
                  ttl_s=d.parse_limit(ttl, "--ttl") if ttl is not None else None,
                  idle_s=d.parse_limit(idle, "--idle") if idle is not None else None,
                  file_systems=list(fs), create_fs=fs_question(yes), verify=not no_verify, keep_on_failure=keep_on_failure,
                  timeout_s=d.parse_limit(timeout, "--timeout") if timeout is not None else None, trust_new=trust_new,
                  guard_on_instance=guard == "on-instance", confirm=None if yes else _ask, nodes=nodes,
                  template=template_for(from_, Path.cwd()))
    ctx = _context(out, with_key=bool(guard))
    with as_interrupt(), ctx.client:
        res = do_up(spec, ctx)
    if json_:
        from .. import jsonvocab

        out.emit_json(jsonvocab.up(res))
        return
    if res.get("nodes"):
        out.success(f"{name}: {len(res['nodes'])} instances ({res['instance_type']}, {res['region']}), "
                    f"${res['price_per_hour_total']:.2f}/h in all")
        for n in res["nodes"]:
            out.info(f"  host #{n['rank']}: instance {n['instance_id']} at {n['ip']} (private {n['private_ip']})")
    else:
        out.success(f"{name}: instance {res['instance_id']} ({res['instance_type']}, {res['region']}) at {res['ip']}, "
                    f"${res['price_per_hour']:.2f}/h")
    if res["ttl_deadline"]:
        out.info(f"TTL: {res['ttl_deadline']} (gpuops reap terminates it after)")
    launcher = " --launcher torchrun" if res.get("nodes") else ""
    out.info(f"next: gpuops sync -p {name}; gpuops train -p {name}{launcher} --script ...; gpuops down {name} when "
             "done")


@app.command("ls")
def ls(json_: bool = JsonOpt) -> None:
    """Every instance on the Lambda account (gpuops-managed ones marked *: a ledger record or gpuops' tags), with
    status, IP, type, region, uptime, cost so far and time left before its TTL (the ledger's, or the instance's TTL
    tag); open launches the API does not list yet. Loud lines for anything that may bill with nothing here using it:
    no profile names it, its bring-up was cut off, the ledger says it ended, or it is past a limit. Then the
    persistent filesystems (they bill per GiB used per month while they exist): size, who mounts them, cost per
    month where a price is known (gpuops fs ls)."""
    from ..cloud import decisions as d
    from ..cloud.reap import listing

    out = output(json_)
    ctx = _context(out)
    with ctx.client:
        doc = listing(ctx, filesystems=True, project_dir=Path.cwd())
    if json_:
        from .. import jsonvocab

        out.emit_json(jsonvocab.ls(doc, out.warnings))
    else:
        rows = doc["instances"]
        if not rows:
            out.print("no instances on the account")
        else:
            w = max([7] + [len(_profile_label(r)) for r in rows])  # whole names: a run's profile is pasted into down
            out.print(f"  {'ID':<34} {'PROFILE':<{w}} {'STATUS':<11} {'IP':<15} {'TYPE':<22} {'REGION':<14} "
                      f"{'UPTIME':>8} {'COST':>9} {'TTL LEFT':>9}")
            for r in rows:
                out.print(f"{'*' if r['managed'] else ' '} {str(r['id'] or '(launching)'):<34} {_profile_label(r):<{w}} "
                          f"{r['status']:<11} {str(r['ip'] or '-'):<15} {str(r['type'])[:22]:<22} "
                          f"{str(r['region'] or '-'):<14} {d.format_duration(r['uptime_s']):>8} "
                          f"{_money(r['cost_so_far']):>9} {d.format_duration(r['ttl_left_s']):>9}")
            out.print("* managed by gpuops")
        _print_filesystems(out, doc.get("filesystems"), doc.get("filesystems_per_month"))
    for a in doc["alerts"]:
        out.warn(a)


def _print_filesystems(out, rows, total) -> None:
    """ls' filesystem lines: each one's region, size, cost per month ("-": no citable price) and who mounts it."""
    from ..cloud import filesystems as fsd

    if not rows:
        return
    out.print("")
    out.print(f"filesystems ({len(rows)}), billed per GiB used per month while they exist:")
    for r in rows:
        by = ", ".join(i["id"] for i in r["instances"]) or "none"
        out.print(f"  {r['name']:<24} {r['region']:<14} {fsd.human_bytes(r['bytes_used']):>10} "
                  f"{_money(r['cost_per_month']):>9}/month  mounted by {by}")
    out.print(f"  in all: {_money(total)}/month" if total is not None else
              "  cost per month: - (no citable price; see `gpuops fs ls`)")


@app.command("down")
def down(
    name: str = typer.Argument(..., help="A profile written by `gpuops up` (or the name of a launch whose profile was "
                                         "never written), or an instance id gpuops launched."),
    fetch_first: bool = typer.Option(False, "--fetch-first", help="Run `gpuops fetch` (verified) for every fetch: "
                                                                  "entry first: termination wipes the disk."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before terminating."),
    json_: bool = JsonOpt,
) -> None:
    """Terminate the instance behind profile NAME (every instance of a fleet, and any other open launch of that
    name), confirm it by reading it back, forget its host key, mark the profile gone. Without a profile: the open
    launches and gpuops instances of that name, or one instance by its id."""
    from ..cloud.down import down as do_down, down_target
    from ..errors import GpuopsError
    from ..interrupts import as_interrupt

    out = output(json_)
    ctx = _context(out)
    with as_interrupt(), ctx.client:
        tgt = down_target(name, ctx, project_dir=Path.cwd())
        prof = tgt.profile
        live = tgt.ids and (prof is None or prof.cloud.state == "active" or not tgt.whole_profile)
        if live and not yes:
            disks = "its disk is" if len(tgt.ids) == 1 else "their disks are"
            if not _ask(f"terminate {tgt.describe()} ({tgt.name}, ${tgt.price_per_hour:.2f}/h); {disks} wiped?"):
                raise GpuopsError("not terminated")
        res = do_down(tgt, ctx, fetch_first=fetch_first, project_dir=Path.cwd())
    if json_:
        out.emit_json(res)
    elif not res["instance_ids"]:
        out.success(f"{res['profile']}: no instance carries its launch; closed launch record(s) "
                    + ", ".join(res["records_closed"]))
    elif len(res["instance_ids"]) > 1:
        states = ", ".join(f"{i} {st}" for i, st in zip(res["instance_ids"], res["statuses"]))
        if res.get("already"):
            out.info(f"{res['profile']}: every instance was already ended ({states})")
        else:
            out.success(f"{res['profile']}: all {len(res['instance_ids'])} instances ended ({states}); host keys "
                        "forgotten" + (", profile marked gone" if prof is not None else ""))
    elif res.get("already"):
        out.info(f"{res['profile']}: instance {res['instance_id']} was already {res['status']}")
    else:
        out.success(f"{res['profile']}: instance {res['instance_id']} is {res['status']}; host key forgotten"
                    + (", profile marked gone" if prof is not None and tgt.whole_profile else ""))


@app.command("reap")
def reap(
    yes: bool = typer.Option(False, "--yes", "-y", help="Terminate without asking (for cron)."),
    json_: bool = JsonOpt,
) -> None:
    """Terminate gpuops-managed instances past their TTL or idle limit (idle confirmed by one sample on the host),
    judged by the ledger and the instances' gpuops tags: one without a profile, or launched from another machine
    (its TTL tag), too. Safe from cron: `gpuops reap --yes`."""
    from ..cloud.reap import reap as do_reap
    from ..interrupts import as_interrupt

    out = output(json_)
    ctx = _context(out)
    with as_interrupt(), ctx.client:
        res = do_reap(ctx, confirm=None if yes else _ask, project_dir=Path.cwd())
    if json_:
        out.emit_json(res)
        return
    if not res["terminated"]:
        out.print("nothing to reap")
    for r in res["terminated"]:
        out.print(f"terminated {r['id']} ({r['profile']}): {'; '.join(r['reasons'])}")
    for r in res["skipped"]:
        out.print(f"kept {r['id']} ({r['profile']}): {r['why']}")
    if res["records_closed"]:
        out.info(f"ledger: closed {len(res['records_closed'])} record(s) the API shows gone: "
                 + ", ".join(res["records_closed"]))
