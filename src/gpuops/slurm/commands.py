"""Slurm's commands on the login node (the talking part of slurm/): sbatch, squeue, sacct, scontrol, sinfo and scancel,
each an argument list quoted word by word (`shlex.quote`), over the profile's ONE connection (remote.connection);
and the run folder's files on the shared filesystem written and read through that same connection.

What is asked and how it is parsed live in slurm/states.py (the formats) and slurm/batch.py (sbatch's argument list);
this module only runs them and hands back their text, with two things learnt from the cluster on the way:
  - whether its squeue has `--json` (Slurm >= 21.08 with its openapi plugin): asked once, the plain format else;
  - whether it has accounting: `sacct` failing with "Slurm accounting storage is disabled" means none, and the
    ending is read from `scontrol show job` (which the controller keeps MinJobAge after the end, 300 s by default).

Secrets never reach a command line: they are written to a 0600 file of the run folder by a here-document inside the
script sent on stdin (created with the mode first, then written), which the batch script sources.
"""
from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from ..errors import RemoteError, UsageError
from ..remote.shell import heredoc, shell_path
from . import states

TIMEOUT = 30.0  # every Slurm command's time limit (a controller that does not answer is said, not waited on)
NO_ACCOUNTING = "accounting storage is disabled"
JOB_ID_FILE = "job_id"  # in the run folder: Slurm's job id, beside gpuops' run id (meta.json)
STOP_FILE = "stop.json"  # what `gpuops stop` did (the endings classifier's `stopped` fact)
SECRETS_FILE = "secrets.env"  # sourced by the batch script (slurm/batch.py)


def quoted(argv: Iterable) -> str:
    """An argument list as one shell command line, every word quoted."""
    return " ".join(shlex.quote(str(a)) for a in argv)


@dataclass
class Gathered:
    """What one status execution brought back, per job and per run (raw text: the parsing is the caller's)."""
    squeue: Optional[str] = None  # squeue's output (JSON or the plain format), None when it failed
    squeue_json: bool = False
    scontrol: dict = field(default_factory=dict)  # job id -> `scontrol --oneliner show job` text ("" unknown)
    sacct: Optional[str] = None  # None: no accounting (or not asked)
    accounting: Optional[bool] = None
    sinfo: Optional[str] = None  # sinfo's nodes (nodes.SINFO_FORMAT), when asked
    found: list = field(default_factory=list)  # (run id, job id) of the runs folder listed
    files: dict = field(default_factory=dict)  # (run dir, name) -> text, None when the file is not there
    tails: dict = field(default_factory=dict)  # run dir -> the log's last lines (list)


class LoginNode:
    """The cluster as seen from its login node, over one open connection (`remote`)."""

    def __init__(self, remote, *, timeout: float = TIMEOUT):
        self.remote, self.timeout = remote, timeout
        self.json: Optional[bool] = None  # squeue --json works here (None: not asked yet)
        self.accounting: Optional[bool] = None
        self._home: Optional[str] = None

    # -- one command ---------------------------------------------------------------------------------------------
    def run(self, argv: list, *, timeout: Optional[float] = None, stdin: Optional[str] = None):
        """One Slurm command (an argument list), its Result."""
        return self.remote.run(quoted(argv), timeout=timeout or self.timeout, stdin=stdin)

    def script(self, text: str, *, timeout: Optional[float] = None):
        """A shell script sent on stdin (`sh -s`): several commands in one execution, each built with quoted()."""
        return self.remote.run("sh -s", stdin=text, timeout=timeout or self.timeout)

    def absolute(self, path: str) -> str:
        """A path of the shared filesystem as Slurm needs it (an #SBATCH line expands no ~): `~/x` -> `$HOME/x`."""
        if path != "~" and not path.startswith("~/"):
            if not path.startswith("/"):
                raise UsageError(f"slurm: remote_dir {path!r} must be absolute or start with ~/ (the job's folder "
                                 "on the shared filesystem)")
            return path.rstrip("/") or "/"
        if self._home is None:
            res = self.remote.run('printf %s "$HOME"', timeout=self.timeout)
            if not res.ok or not res.stdout.startswith("/"):
                raise RemoteError(f"could not read the home folder on the login node: {res.stderr.strip()}")
            self._home = res.stdout.strip().rstrip("/")
        return self._home + path[1:].rstrip("/") if path != "~" else self._home

    # -- sbatch ----------------------------------------------------------------------------------------------------
    def submit(self, *, run_dir: str, files: dict, secrets: dict, sbatch: list, project_dir: str,
               script_rel: Optional[str] = None) -> str:
        """One execution: the job's script is on the shared folder (`script_rel` in `project_dir`), the run folder
        and its files written (`files`: name -> text; `secrets` into a 0600 file), then `sbatch` (an argument list,
        slurm/batch.sbatch_argv) run in the run folder, and the job id it printed written to the run folder's
        JOB_ID_FILE. Returns the job id; a refusal of sbatch is a RemoteError with its words."""
        D = shell_path(run_dir)
        lines = ["set -e", "umask 022"]
        if script_rel:
            lines.append(f"[ -f {shell_path(project_dir.rstrip('/') + '/' + script_rel)} ] || "
                         "{ echo '@noscript'; exit 0; }")
        lines += [f"D={D}", 'mkdir -p "$D"']
        lines += [heredoc(f'"$D"/{shlex.quote(name)}', text).rstrip("\n") for name, text in files.items()]
        if secrets:
            text = "".join(f"{k}={shlex.quote(v)}; export {k}\n" for k, v in secrets.items())
            lines += [f'( umask 077; : > "$D/{SECRETS_FILE}"; chmod 600 "$D/{SECRETS_FILE}" )',
                      heredoc(f'"$D/{SECRETS_FILE}"', text, append=True).rstrip("\n")]
        lines += ["set +e", 'cd "$D"', f"gpuops_out=$({quoted(sbatch)} 2>&1)", "gpuops_rc=$?",
                  'printf "@sbatch %s\\n" "$gpuops_rc"; printf "%s\\n" "$gpuops_out"',
                  '[ "$gpuops_rc" = 0 ] && printf "%s\\n" "${gpuops_out%%;*}" | tail -n 1 > "$D/' + JOB_ID_FILE + '"',
                  "exit 0"]
        res = self.script("\n".join(lines) + "\n", timeout=max(self.timeout, 60))
        out = res.stdout
        if "@noscript" in out:
            raise UsageError(f"{script_rel} is not in {project_dir} on the login node (the shared folder)",
                             hint="sync the project first (drop --no-sync, or `gpuops sync`)")
        m = re.search(r"^@sbatch (\d+)\n(.*)", out, re.S | re.M)
        if not m:
            raise RemoteError(f"could not write the run folder {run_dir} on the login node: "
                              f"{(res.stderr.strip() or out.strip() or f'exit {res.rc}')[-400:]}")
        from .batch import job_id_of

        said = m.group(2).strip()
        job_id = job_id_of(said) if m.group(1) == "0" else None
        if job_id is None:
            raise RemoteError(f"sbatch refused the job: {said[-600:] or 'no output'}",
                              hint=f"the batch script is {run_dir}/job.sbatch (`gpuops train --dry-run` prints it)")
        return job_id

    # -- what Slurm knows of jobs ------------------------------------------------------------------------------------
    def gather(self, job_ids: list, *, runs: Iterable = (), files: Iterable = (), tail: int = 0,
               sacct: bool = True, sinfo: bool = False, listing: Optional[str] = None) -> Gathered:
        """One execution: squeue of every job (--json where it works), `scontrol show job` of each, sacct of all
        (unless accounting is known to be off), sinfo's nodes (sinfo=True: which are down or drained, and why), and
        of each run folder in `runs` the `files` named and the last `tail` lines of the log named by the folder's job
        id (batch.LOG_NAME). listing: a runs folder whose Slurm runs are listed (`found`: (run id, job id) each)."""
        from .batch import LOG_NAME

        ids = [str(j) for j in job_ids if j]
        runs = list(runs)
        parts = []
        if ids:
            if self.json is not False:  # a Slurm without --json (or its plugin) says so: the plain format then
                parts.append(f"echo '@@squeue 1'; {quoted(states.squeue_argv(ids, as_json=True))} 2>&1")
            if self.json is not True:
                parts.append(f"echo '@@squeue 0'; {quoted(states.squeue_argv(ids))} 2>/dev/null")
            for j in ids:
                parts.append(f"echo '@@scontrol {j}'; {quoted(states.scontrol_job_argv(j))} 2>/dev/null")
            if sinfo:
                from .nodes import sinfo_argv

                parts.append(f"echo '@@sinfo'; {quoted(sinfo_argv())} 2>/dev/null")
            if sacct and self.accounting is not False:
                parts.append(f"echo '@@sacct'; {quoted(states.sacct_argv(ids))} 2>&1; echo \"@@sacctrc $?\"")
        if listing:
            parts.append(f"echo '@@found'; for d in {shell_path(listing)}/*/; do "
                         f'[ -s "${{d}}{JOB_ID_FILE}" ] && printf "%s %s\\n" "$(basename "$d")" "$(head -n1 "${{d}}{JOB_ID_FILE}")"; '
                         "done 2>/dev/null")
        for i, d in enumerate(runs):
            D = shell_path(d)
            for name in files:
                parts.append(f"echo '@@file {i} {name}'; cat {D}/{shlex.quote(name)} 2>/dev/null || echo '@@nofile'")
            if tail:
                log = LOG_NAME.replace("%j", "$(cat " + D + "/" + JOB_ID_FILE + " 2>/dev/null)")
                parts.append(f"echo '@@tail {i}'; tail -n {int(tail)} {D}/{log} 2>/dev/null | tr -d '\\r'")
        if not parts:
            return Gathered()
        res = self.script("\n".join(p for p in parts if p) + "\n")
        return self._read(res.stdout, runs)

    def _read(self, text: str, runs: list) -> Gathered:
        g = Gathered()
        key, buf, sections = None, [], []
        for line in text.split("\n"):
            if line.startswith("@@") and not line.startswith("@@sacctrc") and line != "@@nofile":
                if key is not None:
                    sections.append((key, buf))
                key, buf = line[2:].split(" "), []
            else:
                buf.append(line)
        if key is not None:
            sections.append((key, buf))
        for key, buf in sections:
            body = "\n".join(buf).strip("\n")
            if key[0] == "squeue" and g.squeue is None:
                as_json = key[1:] == ["1"]
                if as_json:
                    try:
                        json.loads(body)
                    except ValueError:
                        if re.search(r"option|json|plugin", body, re.I) and "Invalid job id" not in body:
                            self.json = False
                        continue
                    self.json = True
                g.squeue, g.squeue_json = body, as_json
            elif key[0] == "scontrol":
                g.scontrol[key[1]] = body if "JobId=" in body else ""
            elif key[0] == "found":
                g.found = [tuple(x.split()[:2]) for x in buf if len(x.split()) >= 2 and x.split()[1].isdigit()]
            elif key[0] == "sinfo":
                g.sinfo = body
            elif key[0] == "sacct":
                if NO_ACCOUNTING in body:
                    self.accounting, g.accounting = False, False
                else:
                    self.accounting = g.accounting = True
                    g.sacct = "\n".join(x for x in buf if not x.startswith("@@sacctrc"))
            elif key[0] == "file":
                g.files[(runs[int(key[1])], key[2])] = None if buf[:1] == ["@@nofile"] else "\n".join(buf)
            elif key[0] == "tail":
                g.tails[runs[int(key[1])]] = [x for x in buf if x != ""] if buf != [""] else []
        if g.accounting is None and self.accounting is False:
            g.accounting = False
        return g

    def queue_state(self, job_id: str) -> Optional[str]:
        """The job's state as `scontrol show job` says it (None once Slurm has forgotten it)."""
        res = self.run(states.scontrol_job_argv(job_id))
        recs = states.parse_scontrol(res.stdout) if res.ok else []
        return (recs[0].get("JobState") or "").upper() if recs else None

    # -- the nodes' GPUs, through the job's own allocation ---------------------------------------------------------
    def job_gpus(self, job_id: str, nodes: int, *, timeout: float = 20.0) -> dict:
        """Every node's GPUs as the job sees them: one step in the job's allocation (`srun --jobid=J --overlap`: it
        shares the job's resources instead of waiting for them), nvidia-smi once per node. Returns {node: [lines]}
        (nvidia-smi's CSV of jobs.plan.GPU_QUERY, or its error); {} when the step could not run (the job ended)."""
        from ..jobs.plan import GPU_QUERY

        smi = (f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>&1 | "
               'sed "s/^/@gpu ${SLURMD_NODENAME:-?} /"')
        argv = ["srun", f"--jobid={job_id}", "--overlap", f"--nodes={max(1, int(nodes))}", "--ntasks-per-node=1",
                "--quiet", "bash", "-c", smi]
        res = self.run(argv, timeout=timeout)
        out: dict = {}
        for line in res.stdout.splitlines():
            if line.startswith("@gpu "):
                _, node, text = (line.split(" ", 2) + [""])[:3]
                out.setdefault(node, []).append(text)
        return out

    # -- scancel ---------------------------------------------------------------------------------------------------
    def cancel(self, job_id: str, grace: float, *, on_stopping: Optional[Callable[[], None]] = None,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> tuple:
        """Polite first, as a host's stop is: `scancel --signal=TERM` (every step's processes get SIGTERM, the job's
        own handler saves what it saves and exits; not --full: the batch shell, which has no TERM handler, would die
        at once and Slurm would kill the steps with it), then, if it still runs after `grace` seconds, plain
        `scancel` (Slurm's SIGTERM, then SIGKILL after its KillWait). A pending job is simply cancelled. Returns (how, the state seen
        last): how is "TERM", "KILL" (scancel needed), "pending" (cancelled before it started) or "notrunning"."""
        state = self.queue_state(job_id)
        if state is None or state in states.ENDED:
            return "notrunning", state
        if state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED"):
            res = self.run(["scancel", str(job_id)])
            if not res.ok:
                raise RemoteError(f"scancel {job_id}: {res.stderr.strip() or res.stdout.strip()}")
            return "pending", self._settle(job_id, 10.0, sleep, clock)
        if on_stopping:
            on_stopping()
        res = self.run(["scancel", "--signal=TERM", str(job_id)])
        if not res.ok and "already completing or completed" not in res.stderr + res.stdout:
            raise RemoteError(f"scancel --signal=TERM {job_id}: {res.stderr.strip() or res.stdout.strip()}")
        seen = self._settle(job_id, grace, sleep, clock)
        if seen is None or seen in states.ENDED:
            return "TERM", seen
        self.run(["scancel", str(job_id)])
        return "KILL", self._settle(job_id, max(10.0, grace), sleep, clock)

    def _settle(self, job_id: str, within: float, sleep, clock) -> Optional[str]:
        """Poll the job's state until it has ended (or is forgotten) or `within` seconds passed; the last state."""
        deadline = clock() + within
        every = 0.1
        while True:
            state = self.queue_state(job_id)
            if state is None or state in states.ENDED or clock() >= deadline:
                return state
            sleep(every)
            every = min(1.0, every * 1.5)

    # -- the run folder's files ------------------------------------------------------------------------------------
    def write_file(self, path: str, text: str) -> None:
        res = self.script("umask 022\n" + heredoc(shell_path(path), text))
        if not res.ok:
            raise RemoteError(f"could not write {path} on the login node: {res.stderr.strip()}")

    def write_resume(self, run_dir: str, checkpoint: str) -> None:
        """The run folder's resume file (batch.RESUME_FILE): the checkpoint a requeued attempt of this run starts
        from (the batch script reads it at its start and exports GPUOPS_RESUME_FROM). Written beside it and renamed
        over it, so an attempt starting meanwhile reads the old line or the new one, never half of one."""
        from .batch import RESUME_FILE, resume_text

        path = f"{run_dir.rstrip('/')}/{RESUME_FILE}"
        tmp = path + ".tmp"
        res = self.script("umask 022\n" + heredoc(shell_path(tmp), resume_text(checkpoint))
                          + f"mv -f {shell_path(tmp)} {shell_path(path)}\n")
        if not res.ok:
            raise RemoteError(f"could not write {path} on the login node: {res.stderr.strip()}")

    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> tuple[Optional[int], bytes]:
        """The file's size and its bytes from `offset` (at most `limit`), in one execution; (None, b"") when it is
        not there."""
        P = shell_path(path)
        cmd = (f"[ -f {P} ] || exit 3; wc -c < {P}; tail -c +{int(offset) + 1} {P} | head -c {int(limit)}")
        chan = self.remote.stream(f"sh -c {shlex.quote(cmd)}")
        data = bytearray()
        try:
            while True:
                got = chan.recv(1 << 16)
                if not got:
                    break
                data += got
            rc = chan.recv_exit_status()
        finally:
            chan.close()
        if rc == 3:
            return None, b""
        head, _, rest = bytes(data).partition(b"\n")
        try:
            return int(head.strip()), rest
        except ValueError:
            raise RemoteError(f"could not read {path} on the login node") from None
