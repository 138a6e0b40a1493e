"""Distributed launchers as data plus small renderers: what each node of a fleet runs, and its environment.

gpuops builds no distributed engine: `torchrun` (torch.distributed.run) and Ray do the work. This module only says,
purely, which command line each node runs with which addresses, ranks and ports; jobs/scripts.py starts it.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ..hostpool import MASTER_PORT

LAUNCHERS = ("none", "torchrun", "ray")
NEEDS = {"torchrun": "torch", "ray": "ray"}  # the package each launcher runs from, in the profile's python
# The launcher commands a .sh job may call, and the module each runs (its console script's): launch.sh gives a job
# whose environment's bin/ lacks one (the torch is the image's, seen through --system-site-packages) a shim that runs
# the module with the environment's python. Sources: pytorch.org/docs/stable/elastic/run.html (torchrun is
# torch.distributed.run), accelerate's setup.py console_scripts (accelerate.commands.accelerate_cli:main),
# deepspeed's bin/deepspeed (deepspeed.launcher.runner:main).
LAUNCHER_COMMANDS = (("torchrun", "torch.distributed.run"), ("accelerate", "accelerate.commands.accelerate_cli"),
                     ("deepspeed", "deepspeed.launcher.runner"))
RAY_PORT = 6379  # Ray's default GCS port
RAY_JOIN_TIMEOUT = 180  # seconds the head waits for every node to join, and a worker for the head
RAY_JOIN_ENV = "GPUOPS_RAY_JOIN_TIMEOUT"  # the job environment's override of RAY_JOIN_TIMEOUT
RAY_INCOMPLETE = 69  # the head's exit code when the cluster did not form (EX_UNAVAILABLE)


@dataclass(frozen=True)
class Fleet:
    """The addresses the nodes reach each other on (rank order), the rendezvous port and GPUs per node."""
    addresses: tuple[str, ...]
    master_port: int = MASTER_PORT
    gpus_per_node: int = 1

    @property
    def nnodes(self) -> int:
        return len(self.addresses)

    @property
    def master_addr(self) -> str:
        return self.addresses[0]


def node_env(fleet: Fleet, rank: int) -> dict[str, str]:
    """The variables every node's job gets: gpuops' own names and torch's."""
    return {
        "GPUOPS_NODE_RANK": str(rank),
        "GPUOPS_NUM_NODES": str(fleet.nnodes),
        "GPUOPS_NODE_IPS": ",".join(fleet.addresses),
        "GPUOPS_MASTER_ADDR": fleet.master_addr,
        "GPUOPS_MASTER_PORT": str(fleet.master_port),
        "GPUOPS_GPUS_PER_NODE": str(fleet.gpus_per_node),
        "MASTER_ADDR": fleet.master_addr,
        "MASTER_PORT": str(fleet.master_port),
        "NODE_RANK": str(rank),
        "WORLD_SIZE": str(fleet.nnodes * fleet.gpus_per_node),
    }


def _python_words(python: str) -> list[str]:
    return shlex.split(python or "python3") or ["python3"]


def torchrun_argv(job: list[str], *, python: str, fleet: Fleet, rank: int, nproc_per_node: int) -> list[str]:
    """`python -m torch.distributed.run` (torchrun, from the profile's Python, so no PATH lookup) around the job:
    a .py job keeps its script; anything else runs with --no-python."""
    py = _python_words(python)
    head = [*py, "-m", "torch.distributed.run", "--nnodes", str(fleet.nnodes), "--node_rank", str(rank),
            "--master_addr", fleet.master_addr, "--master_port", str(fleet.master_port),
            "--nproc_per_node", str(nproc_per_node)]
    if job[:len(py)] == py:
        rest = job[len(py):]
        if rest[:1] == ["-u"]:
            rest = rest[1:]
        return head + rest
    return head + ["--no-python", *job]


def ray_address(fleet: Fleet, port: int = RAY_PORT) -> str:
    return f"{fleet.master_addr}:{port}"


def join_timeout(env: Mapping[str, str]) -> int:
    """Seconds the Ray head waits for every node to join (and a worker for the head): GPUOPS_RAY_JOIN_TIMEOUT in the
    job's environment (profile `env:`, `--env`), else RAY_JOIN_TIMEOUT."""
    raw = (env.get(RAY_JOIN_ENV) or "").strip()
    if not raw:
        return RAY_JOIN_TIMEOUT
    if not raw.isdigit() or int(raw) < 1:
        from ..errors import UsageError

        raise UsageError(f"{RAY_JOIN_ENV} must be a whole number of seconds, at least 1 (got {raw!r})",
                         hint=f"e.g. --env {RAY_JOIN_ENV}=600 for nodes that take long to start")
    return int(raw)


def ray_temp_dir(run_id: str, rank: int, where: str) -> str:
    """A node's own Ray temp dir: short (Ray's socket paths under it must stay within the 107 bytes of a Unix socket
    path), one per run and node (`where`: user, host and folder, so two runs with one id never share one)."""
    digest = hashlib.sha1("\0".join((run_id, where)).encode()).hexdigest()[:10]
    return f"/tmp/gpuops-ray-{digest}-{int(rank)}"


def ray_start_argv(*, python: str, fleet: Fleet, rank: int, port: int = RAY_PORT, num_gpus: Optional[int] = None,
                   temp_dir: Optional[str] = None) -> list[str]:
    """`ray start` for one node: the head on rank 0 (dashboard kept to 127.0.0.1), a worker joining it elsewhere.
    Each node keeps its own temp dir when given (several sandbox hosts share one machine's /tmp)."""
    py = _python_words(python)
    argv = [*py, "-m", "ray.scripts.scripts", "start", f"--node-ip-address={fleet.addresses[rank]}",
            "--disable-usage-stats"]
    if rank == 0:
        argv += ["--head", f"--port={port}", "--dashboard-host=127.0.0.1"]
    else:
        argv += [f"--address={ray_address(fleet, port)}"]
    if temp_dir:
        argv.append(f"--temp-dir={temp_dir}")
    if num_gpus is not None:
        argv.append(f"--num-gpus={num_gpus}")
    return argv


# -- shell text for launch.sh (every value quoted) ------------------------------------------------------------------
def _cmd(argv: list[str], python: str) -> str:
    from ..remote.shell import shell_command

    py = _python_words(python)
    if argv[:len(py)] == py:
        return " ".join([shell_command(python)] + [shlex.quote(w) for w in argv[len(py):]])
    return " ".join(shlex.quote(w) for w in argv)


def ifname_prelude(address: str) -> str:
    """Export NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME as the interface that carries this node's address (found on
    the host when the job starts), unless the user set them."""
    a = shlex.quote(address)
    return ("gpuops_ip=$(command -v ip || { [ -x /usr/sbin/ip ] && echo /usr/sbin/ip; } || "
            "{ [ -x /sbin/ip ] && echo /sbin/ip; })\n"
            f"gpuops_if=$(\"${{gpuops_ip:-ip}}\" -o -4 addr show 2>/dev/null | awk -v a={a} '{{split($4, x, \"/\"); "
            "if (x[1] == a) {print $2; exit}}')\n"
            'if [ -n "$gpuops_if" ]; then\n'
            '  [ -n "${NCCL_SOCKET_IFNAME:-}" ] || { NCCL_SOCKET_IFNAME=$gpuops_if; export NCCL_SOCKET_IFNAME; }\n'
            '  [ -n "${GLOO_SOCKET_IFNAME:-}" ] || { GLOO_SOCKET_IFNAME=$gpuops_if; export GLOO_SOCKET_IFNAME; }\n'
            "fi")


def _port_probe(host: str, port: int, python: str) -> str:
    return _cmd([*_python_words(python), "-c", "import socket, sys; socket.create_connection((sys.argv[1], "
                 "int(sys.argv[2])), 2).close()", host, str(port)], python)


# sh functions: this node's Ray processes, and ending them. Ray's daemons (GCS, raylet, dashboard, monitors, agents)
# stay in the run's process group (`ray start` does not leave it; they block SIGINT, so a stop's first signal leaves
# them running) and name the node's temp dir on their command lines; its workers are the raylet's children, each in a
# process group of its own, renamed `ray::...`, with their logs open under the temp dir. Another Ray on the machine
# (another run's, the user's own) has none of these, so it is never touched (`ray stop` would end every Ray process of
# the user); the calling shell, its ancestors and its children (the listing itself) never count.
RAY_PROCS_FN = r"""
gpuops_ray_select() {  # ps lines, @fd, ls -l of /proc/*/fd/ in; $1 temp dir, $2 process group, $3 caller
  GPUOPS_RAY_T=$1 GPUOPS_RAY_G=$2 GPUOPS_RAY_SELF=$3 awk '
    BEGIN { t = ENVIRON["GPUOPS_RAY_T"] "/"; g = ENVIRON["GPUOPS_RAY_G"]; self = ENVIRON["GPUOPS_RAY_SELF"] }
    function rayish(a) { return a ~ /^ray::/ || index(a, "/ray/") || index(a, "ray.scripts") }
    $0 == "@fd" { fd = 1; next }
    !fd {
      a = $0; sub(/^[ \t]*[0-9]+[ \t]+[0-9]+[ \t]+[0-9]+[ \t]?/, "", a)
      pp[$1] = $2; args[$1] = a
      if (rayish(a) && (index(a, t) || (g != "" && $3 == g))) root[$1] = 1
      next
    }
    /^\/proc\/[0-9]+\/fd\/?:$/ { split($0, x, "/"); cur = x[3]; next }
    cur != "" && index($0, " -> " t) && rayish(args[cur]) { root[cur] = 1 }
    END {
      p = self; while (p != "" && !(p in anc)) { anc[p] = 1; p = pp[p] }
      kid[self] = 1
      do { more = 0; for (q in pp) if (!(q in kid) && (pp[q] in kid)) { kid[q] = 1; more = 1 } } while (more)
      for (q in root) ours[q] = 1
      do { more = 0; for (q in pp) if (!(q in ours) && (pp[q] in ours)) { ours[q] = 1; more = 1 } } while (more)
      for (q in ours) if ((q in pp) && !(q in anc) && !(q in kid)) print q
    }'
}
gpuops_ray_pids() {
  [ -n "$1" ] || return 0
  { ps -e -ww -o pid= -o ppid= -o pgid= -o args= 2>/dev/null; echo @fd; ls -l /proc/[0-9]*/fd/ 2>/dev/null; } |
    gpuops_ray_select "$1" "${2:-}" $$
}
gpuops_live() {
  gpuops_st=$(sed -n 's/.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null)
  if [ -d /proc/self ]; then [ -n "$gpuops_st" ] && [ "$gpuops_st" != Z ]; else kill -0 "$1" 2>/dev/null; fi
}
gpuops_ray_kill() {
  [ $# -gt 0 ] || return 0
  kill -s TERM "$@" 2>/dev/null
  gpuops_i=0
  while :; do
    gpuops_left=; for gpuops_p in "$@"; do gpuops_live "$gpuops_p" && gpuops_left="$gpuops_left $gpuops_p"; done
    [ -n "$gpuops_left" ] || return 0
    [ $gpuops_i -lt 50 ] || break
    sleep 0.1; gpuops_i=$((gpuops_i+1))
  done
  kill -s KILL $gpuops_left 2>/dev/null
  return 0
}
gpuops_ray_end() {
  gpuops_ray_kill $(gpuops_ray_pids "$1" "${2:-}")
}
"""


def _ray_prelude(temp_dir: str) -> str:
    """The start of a node's script: stop signals deferred (the script ends its Ray processes before it exits), the
    Ray functions, and `gpuops_end RC`: end this node's Ray processes, then exit RC."""
    return ("trap 'gpuops_sig=1' INT TERM HUP\n" + RAY_PROCS_FN.strip("\n") + "\n"
            f"gpuops_ray_dir={shlex.quote(temp_dir)}\n"
            'gpuops_pg=$(cat "$GPUOPS_RUN_DIR/pid" 2>/dev/null)\n'  # the run's process group: launch.sh's pid
            'gpuops_end() { gpuops_ray_end "$gpuops_ray_dir" "$gpuops_pg"; exit "$1"; }\n')


def ray_missing(expected: list, nodes: list) -> list:
    """The nodes of `expected` ([rank, address, temp dir] each) that Ray's node table (`ray.nodes()`) does not list
    alive, as [rank, address]: a node is known by its raylet's socket, which lies under its own temp dir, or, where
    its address is unique in the fleet, by its address. Runs on the head too (its source is part of the wait), so
    it uses nothing but builtins."""
    alive = [x for x in nodes if x.get("Alive")]
    sockets = [str(x.get("RayletSocketName") or "") for x in alive]
    seen = {str(x.get("NodeManagerAddress") or "") for x in alive}
    addresses = [e[1] for e in expected]
    return [[rank, address] for rank, address, temp in expected
            if not any(s.startswith(temp + "/") for s in sockets)
            and not (addresses.count(address) == 1 and address in seen)]


# The head's wait for the cluster, with the profile's python and Ray's own node table: every node alive (Ray's count),
# or, after the wait, the nodes missing named and exit RAY_INCOMPLETE.
WAIT_LOOP = r"""
import json, logging, os, sys, time
address, wait, expected = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
try:
    import ray
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
except KeyboardInterrupt:
    sys.exit(130)
except Exception as e:
    print(f"gpuops: cannot reach the Ray head at {address}: {e}", file=sys.stderr, flush=True)
    sys.exit(__INCOMPLETE__)
n = len(expected)
t0 = time.monotonic()
said = 0
try:
    while True:
        nodes = ray.nodes()
        alive = len([x for x in nodes if x.get("Alive")])
        took = time.monotonic() - t0
        if alive >= n:
            print(f"gpuops: {n} of {n} Ray nodes joined ({took:.1f} s); starting the job", flush=True)
            sys.exit(0)
        names = ", ".join(f"host #{r} ({a})" for r, a in ray_missing(expected, nodes)) or "not named"
        if took >= wait:
            run = os.environ.get("GPUOPS_RUN_ID", "RUN")
            print(f"gpuops: the Ray cluster is incomplete: {alive} of {n} Ray nodes joined in {wait} s; missing: "
                  f"{names}. The job was not started and this run's Ray processes are stopped. See the missing hosts' "
                  f"logs (gpuops logs {run} --host N); to wait longer: --env __JOIN_ENV__=SECONDS", file=sys.stderr,
                  flush=True)
            sys.exit(__INCOMPLETE__)
        if took >= said:
            print(f"gpuops: {alive} of {n} Ray nodes joined; waiting up to {wait} s for {names}", flush=True)
            said += 30
        time.sleep(0.5)
except KeyboardInterrupt:
    sys.exit(130)
finally:
    ray.shutdown()
"""


def _wait_source() -> str:
    import inspect

    loop = WAIT_LOOP.replace("__INCOMPLETE__", str(RAY_INCOMPLETE)).replace("__JOIN_ENV__", RAY_JOIN_ENV)
    return inspect.getsource(ray_missing) + loop


def ray_command(job: list[str], *, python: str, fleet: Fleet, rank: int, temp_dirs: Sequence[str],
                port: int = RAY_PORT, num_gpus: Optional[int] = None, join_timeout: int = RAY_JOIN_TIMEOUT) -> str:
    """What a node of a Ray run executes (a child `sh`, in the run's process group). Rank 0 starts the head, waits
    until every node has joined (at most join_timeout seconds, else exit RAY_INCOMPLETE naming the missing nodes),
    runs the job with RAY_ADDRESS set, then ends its Ray processes. The others wait for the head (as long), join it,
    stay while it answers, then end their Ray processes and exit 0 (1 if they could not join). Every way out (the
    job's end, a failure, `gpuops stop`'s signals, the head gone) ends this node's Ray processes, and only those."""
    own = temp_dirs[rank]
    start = _cmd(ray_start_argv(python=python, fleet=fleet, rank=rank, port=port, num_gpus=num_gpus, temp_dir=own),
                 python)
    addr = ray_address(fleet, port)
    qaddr = shlex.quote(addr)
    wait = int(join_timeout)
    if rank == 0:
        expected = json.dumps([[r, a, t] for r, (a, t) in enumerate(zip(fleet.addresses, temp_dirs))])
        script = (_ray_prelude(own) +
                  f"{start} || {{ gpuops_rc=$?; echo \"gpuops: ray start failed on this host (exit $gpuops_rc)\" >&2; "
                  "gpuops_end $gpuops_rc; }\n"
                  f"[ -z \"${{gpuops_sig:-}}\" ] || gpuops_end 130\n"
                  f"{_cmd([*_python_words(python), '-c', _wait_source(), addr, str(wait), expected], python)}"
                  " || gpuops_end $?\n"
                  "[ -z \"${gpuops_sig:-}\" ] || gpuops_end 130\n"
                  f"RAY_ADDRESS={qaddr}; export RAY_ADDRESS\n"
                  f"{_cmd(job, python)}\n"
                  "gpuops_end $?\n")
    else:
        probe = _port_probe(fleet.master_addr, port, python)
        late = shlex.quote(f"gpuops: the Ray head at {addr} did not answer in {wait} s")
        failed = shlex.quote(f"gpuops: this host could not join the Ray cluster at {addr}")
        script = (_ray_prelude(own) +
                  "gpuops_t0=$(date +%s)\n"
                  f"until {probe} 2>/dev/null; do\n"
                  "  [ -z \"${gpuops_sig:-}\" ] || exit 130\n"
                  f"  if [ $(( $(date +%s) - gpuops_t0 )) -ge {wait} ]; then echo {late} >&2; exit 1; fi\n"
                  "  sleep 1\n"
                  "done\n"
                  f'{start} || {{ gpuops_rc=$?; echo {failed}" (ray start exit $gpuops_rc)" >&2; gpuops_end 1; }}\n'
                  f"while [ -z \"${{gpuops_sig:-}}\" ] && {probe} 2>/dev/null; do sleep 2; done\n"
                  "[ -z \"${gpuops_sig:-}\" ] || { echo 'gpuops: stopped; leaving the Ray cluster'; gpuops_end 130; }\n"
                  "echo 'gpuops: the Ray head has gone; leaving the cluster'\n"
                  "gpuops_end 0\n")
    return "sh -c " + shlex.quote(script)
