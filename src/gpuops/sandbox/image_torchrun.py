"""The emulated `torch.distributed.run` (torchrun) of an emulated image's torch (stdlib only), installed as
torch/distributed/run.py beside image_torch.py, with a `torchrun` in the image's bin/ whose #! line is the image's
python, as Lambda Stack's /usr/bin/torchrun is the system python's. It starts --nproc_per_node copies of the script
(or `-m module`) with the python it runs under, with the variables torchrun gives each process (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and exits with the first non-zero exit code. Other options
are skipped with their values."""
import os
import subprocess
import sys

FLAGS = {"--standalone", "-m", "--module", "--run-path", "--run_path", "--no-python", "--no_python"}


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    nproc, module, no_python, i = 1, False, False, 0
    while i < len(args) and args[i].startswith("-"):
        key, eq, val = args[i].partition("=")
        if key in FLAGS:
            module = module or key in ("-m", "--module")
            no_python = no_python or key in ("--no-python", "--no_python")
            i += 1
            continue
        if not eq:
            val = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        i += 1
        if key in ("--nproc_per_node", "--nproc-per-node"):
            nproc = int(val) if val.isdigit() else 1
    if i >= len(args):
        print("torchrun: error: the following arguments are required: training_script", file=sys.stderr)
        sys.exit(2)
    target, rest = args[i], args[i + 1:]
    cmd = [target] if no_python else [sys.executable, "-u"] + (["-m", target] if module else [target])
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                   MASTER_PORT=os.environ.get("MASTER_PORT", "29500"))
        procs.append(subprocess.Popen(cmd + rest, env=env))
    codes = [p.wait() for p in procs]
    sys.exit(next((c for c in codes if c), 0))


if __name__ == "__main__":
    main()
