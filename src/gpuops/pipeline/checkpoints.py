"""Where a run's checkpoints live, whose they are, and which count: ONE decision (pure), asked by the checkpoint
fetcher, the recovery and the summary alike (pipeline/recovery.py, pipeline/runner.py), never recomputed in each.

Where (issue #27):
- On the instance: the job writes its checkpoint folder where the run's --fetch entry says (the first --fetch name,
  `checkpoints` if named: `checkpoint_name`), relative to the remote project folder (the job's working directory)
  unless absolute. The run's sync never uploads a --fetch folder (`sync_excludes`): what is in the project here (a
  step folder left from an earlier experiment, another run's fetch) never reaches the instance as a checkpoint.
- Here: every --fetch name of a run is fetched into `runs/<run id>/<name>` (`local_dir`), a folder no other run
  shares (the run id is unique: pipeline.runner.new_record). `runs/` is never synced. A replacement is pushed only
  from there.
- On a filesystem (`run --fs NAME`): the checkpoint folder (the first --fetch name, or `checkpoints`) is the run's
  own folder there, `<mount>/gpuops/runs/<run id>/<name>` (`fs_dir`), and `<name>` in the remote project folder is a
  symlink to it (`link_command`), so the job still writes `<name>/...` with no code change. It outlives every
  instance: a replacement attaches the same filesystem and resumes from there (no push; no checkpoint byte through
  this machine). `--fetch` still brings what it names here at the end; without --fetch nothing is fetched.

Which count (`resumable`), judged on the listing of the folder and what the SAME remote execution saw beside it
(`Seen`: the files held open for writing by the job's processes, the contents of the frameworks' marker files, the
files whose format says they are cut short), by the rules of playbooks/checkpoints.yaml, each with its source:
- never a step folder whose newest file is older than the job's start (`since`, the instance's own clock): it was
  there before this job (pushed for it to resume from, or left there by something else), not written by it;
- never a folder with a temporary name inside, a file open for writing by the job, a file cut short (a torch.save
  zip without its end record, a safetensors file whose header does not match its size), or that lacks a file its
  predecessor has;
- then it counts by one piece of evidence, recorded with it (`Verdict.evidence`, the record's checkpoint entry):
  a framework's marker (gpuops' COMPLETE, DeepSpeed's `latest`, Megatron's and verl's tracker file,
  torch.distributed.checkpoint's .metadata, HF Trainer's trainer_state.json, Orbax's commit marker); a successor
  (the job moved past it); the job's success; its predecessor's file set, none smaller (not for the first step
  folder of its kind: that one waits for a marker, a successor or the job's end); or, timing only, the folder held
  still for QUIET_SAMPLES samples while the job was alive (`quiet`). A job's death revokes what timing alone gave
  (`after_death`): a replacement never resumes from such a folder.
A folder with no step folders is one checkpoint (the whole folder): a marker, the job's success, or timing.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..transfer.ckptjudge import Seen, Verdict, dangling, evidence_spec, judge, said  # noqa: F401 (the judgement, here and on a cluster)

QUIET_SAMPLES = 2  # the checkpoint folder's listing the same in this many watch samples in a row, job alive (rule d)
DEFAULT_NAME = "checkpoints"


@dataclass(frozen=True)
class Home:
    """Where the checkpoints of one run live."""
    name: str  # the --fetch name that holds them
    local: str  # here, relative to the project folder: runs/<run id>/<name>
    remote: str  # on the instance: the fetch entry (relative to the remote project folder, unless absolute)
    filesystem: Optional[str] = None  # on a Lambda filesystem (run --fs): its path there; None: the instance's disk

    def to_json(self) -> dict:
        return {"name": self.name, "local": self.local, "remote": self.remote, "filesystem": self.filesystem}


def checkpoint_name(fetch: list) -> Optional[str]:
    """The --fetch name that holds the checkpoints: `checkpoints` if named, else the first name (None: no --fetch)."""
    return DEFAULT_NAME if DEFAULT_NAME in fetch else (fetch[0] if fetch else None)


def local_dir(run_id: str, name: str) -> str:
    """Where --fetch NAME of run `run_id` lands here, relative to the project folder."""
    return f"runs/{run_id}/{name}"


def fetch_dest(run_id: str, name: str, project: Path) -> Path:
    return project / local_dir(run_id, name)


def fs_dir(mount: str, run_id: str, name: str) -> str:
    """The run's own checkpoint folder on a filesystem mounted at `mount`."""
    return f"{mount.rstrip('/')}/gpuops/runs/{run_id}/{name}"


def home(run_id: str, fetch: list, fetch_map: Optional[dict] = None, mount: Optional[str] = None) -> Optional[Home]:
    """The run's checkpoint home (None: no checkpoints to keep: no --fetch and no filesystem). fetch_map: the
    profile's fetch: entries (a name the map lacks is the folder of that name under the remote project); mount: the
    run's filesystem's mount point (run --fs), where the checkpoints then live (an entry inside the project only)."""
    name = checkpoint_name(fetch) or (DEFAULT_NAME if mount else None)
    if name is None:
        return None
    remote = (fetch_map or {}).get(name, name)
    inside = not str(remote).startswith(("/", "~", ".."))
    return Home(name=name, local=local_dir(run_id, name), remote=remote,
                filesystem=fs_dir(mount, run_id, name) if mount and inside else None)


def names(fetch: list, mount: Optional[str]) -> list:
    """Every output folder of the run: the --fetch names, and the checkpoint folder on a filesystem."""
    name = checkpoint_name(fetch) or (DEFAULT_NAME if mount else None)
    return list(dict.fromkeys(list(fetch) + ([name] if name else [])))


def link_command(remote_project: str, sub: str, fs_path: str) -> str:
    """ONE remote execution: the run's folder on the filesystem made, `<project>/<sub>` a symlink to it (a job
    writes `<sub>/...` unchanged), then its listing (relative path, size, mtime: tab-separated) for the choice of the
    checkpoint to resume from. Exit 3: `<sub>` is a non-empty folder of its own (said, nothing changed)."""
    import shlex

    from ..remote.shell import shell_path

    link = shell_path(remote_project.rstrip("/") + "/" + sub.strip("/").removeprefix("./"))
    f = shlex.quote(fs_path)
    return (f"mkdir -p {f} || exit 4\n"
            f"if [ -d {link} ] && [ ! -L {link} ]; then rmdir {link} 2>/dev/null || exit 3; fi\n"
            f"mkdir -p \"$(dirname {link})\" && ln -sfn {f} {link} || exit 4\n"
            f"find {f} -type f -printf '%P\\t%s\\t%T@\\n'\n")


def set_aside(steps: dict, resume_step: Optional[int]) -> list:
    """On a filesystem, the step folders newer than the one a replacement resumes from (None: it starts from the
    beginning): not known complete when the job died, set aside so the resumed job writes those steps afresh (a
    rename onto a folder that exists fails)."""
    return sorted(k for k, v in steps.items() if v["step"] > (resume_step or 0) or resume_step is None)


def set_aside_command(fs_path: str, dirs: list, stamp: str) -> str:
    """ONE remote execution: each of `dirs` (relative to the run's checkpoint folder on the filesystem) moved into a
    sibling folder `<name>.passed-over/` (never deleted: it is still there to look at)."""
    import shlex

    aside = fs_path.rstrip("/") + ".passed-over"
    cmds = [f"mkdir -p {shlex.quote(aside)}"]
    for d in dirs:
        src = shlex.quote(fs_path.rstrip("/") + "/" + d)
        dst = shlex.quote(aside + "/" + d.replace("/", "_") + "." + stamp)
        cmds.append(f"mv -- {src} {dst}")
    return " && ".join(cmds)


def parse_listing(text: str) -> list:
    """link_command's listing -> [[relative path, size, mtime]] (transfer.plan.step_dirs' rows)."""
    rows = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            try:
                rows.append([parts[0], int(parts[1]), float(parts[2])])
            except ValueError:
                continue
    return rows


def where(entry: Optional[dict]) -> Optional[str]:
    """Where a kept checkpoint is, as said: here (runs/<id>/...) or on the filesystem."""
    if not entry:
        return None
    return entry.get("local") or entry.get("filesystem")


def get_later(home: Home, fs_name: str, instance_type: str) -> str:
    """How to bring checkpoints left on a filesystem here later (no instance mounts it once the run ended)."""
    return (f"gpuops up ckpt --fs {fs_name} --type {instance_type or 'TYPE'}; add `fetch: {{{home.name}: "
            f"{home.filesystem}}}` to that profile; gpuops fetch -p ckpt {home.name}; gpuops down ckpt")


def since(job_started: Optional[float], home: Optional[Home]) -> Optional[float]:
    """The time a checkpoint must be newer than to be this job's: the job's start on the instance's clock; none on a
    filesystem (the run's own folder there holds only its own; and its server's clock is not the instance's)."""
    return None if home is not None and home.filesystem else job_started


def sync_excludes(fetch: list, fetch_map: Optional[dict] = None) -> list[str]:
    """rsync exclusions (anchored at the project) for the run's output folders: every --fetch entry inside the
    project, so sync never uploads what a run fetches (a stale step folder, another run's checkpoints)."""
    out = []
    for name in fetch:
        sub = str((fetch_map or {}).get(name, name)).strip()
        if not sub or sub.startswith(("/", "~")) or sub.startswith(".."):
            continue
        sub = sub[2:] if sub.startswith("./") else sub
        out.append("/" + sub.strip("/"))
    return list(dict.fromkeys(out))


def entry(name: str, sub: str, step_dir: Optional[str], step: Optional[int], at: float, run_id: str,
          filesystem: Optional[str] = None, evidence: Optional[list] = None, warnings: Optional[list] = None) -> dict:
    """A fetched checkpoint as the record keeps it: `path` on the instance (the fetch entry's own spelling: relative
    to the project folder, the job's working directory, unless absolute), `local` here (runs/<run id>/<name>/...);
    on a filesystem (filesystem: the run's folder there), `filesystem` instead of `local` (nothing fetched)."""
    base = sub.rstrip("/") or "."
    loc = local_dir(run_id, name)
    e = {"name": name, "dir": step_dir, "step": step, "at": at, "evidence": list(evidence or []),
         "path": f"{base}/{step_dir}" if step_dir else base,
         "local": f"{loc}/{step_dir}" if step_dir else loc}
    if filesystem:
        e["local"], e["filesystem"] = None, f"{filesystem}/{step_dir}" if step_dir else filesystem
    if warnings:
        e["warnings"] = list(warnings)
    return e


def newer(entry_a: Optional[dict], entry_b: Optional[dict]) -> bool:
    """Is checkpoint entry_a a later one than entry_b (a later step; no step: a later fetch)?"""
    if entry_a is None:
        return False
    if entry_b is None:
        return True
    sa, sb = entry_a.get("step"), entry_b.get("step")
    if sa is not None and sb is not None:
        return sa >= sb
    return (entry_a.get("at") or 0) >= (entry_b.get("at") or 0)


# -- which count: evidence (playbooks/checkpoints.yaml) -----------------------------------------------------------
def resumable(steps: dict, *, files: list, since: Optional[float], job: str, quiet: bool,
              seen: Optional[Seen] = None, rules: Optional[dict] = None) -> Verdict:
    """transfer.ckptjudge.judge by playbooks/checkpoints.yaml (`book`) unless rules are given."""
    return judge(steps, files=files, since=since, job=job, quiet=quiet, seen=seen,
                 rules=rules if rules is not None else book())


def book(project: Optional[Path] = None) -> dict:
    """playbooks/checkpoints.yaml (the project's own playbooks/ overrides it)."""
    from ..knowledge import load_playbook

    return load_playbook("checkpoints", project)


def durable(evidence: Optional[list], rules: Optional[dict] = None) -> bool:
    """Does this vouching outlive the job's death? (a checkpoint recorded before evidence was: yes, as it counted)"""
    if not evidence:
        return True
    keep = set((rules or {}).get("durable") or ("marker", "successor", "succeeded", "predecessor"))
    return any(e.split(":", 1)[0] in keep for e in evidence)


def after_death(vouched: list, rules: Optional[dict] = None) -> tuple[Optional[dict], list]:
    """The job died (failed, killed, stopped, its instance or GPU lost): the checkpoints that counted only by timing
    no longer do. vouched: every checkpoint entry that counted, oldest first. Returns (the newest one that still
    counts, or None; those revoked)."""
    keep = [e for e in vouched if durable(e.get("evidence"), rules)]
    gone = [e for e in vouched if not durable(e.get("evidence"), rules)]
    newest = None
    for e in keep:
        if newer(e, newest):
            newest = e
    return newest, gone
