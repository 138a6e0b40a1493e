"""`gpuops ssh` through the sandbox's real sshd: a command and its exit code, a port forward reached over HTTP, a
changed host key refused, a fleet's --node, the slips of its command line."""
from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from support.forward import Hello, free_port, gpuops_proc, through_forward
from support.helpers import default_sigint
from gpuops.remote import interactive


def test_a_command_runs_on_the_host_and_its_exit_code_is_gpuops_own(sandbox):
    p = gpuops_proc("ssh", "sandbox", "--", "echo on-$(hostname)-as-$USER; echo to-err >&2; exit 7")
    assert p.returncode == 7, p.stderr
    assert p.stdout.startswith("on-") and f"-as-{sandbox['user']}" in p.stdout, p.stdout
    assert "to-err" in p.stderr
    # the default profile (the only one) and no profile word: the words after -- are the command
    p = gpuops_proc("ssh", "--", "test", "-d", "$HOME")
    assert p.returncode == 0, p.stderr
    p = gpuops_proc("ssh", "--", "exit 0")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    # the host's HOME is the sandbox's, not this test's: the session is on the host
    p = gpuops_proc("ssh", "sandbox", "--", "echo $HOME")
    assert p.stdout.strip() == str(sandbox["dir"] / "home"), p.stdout


def test_the_command_line_uses_gpuops_known_hosts_strictly(sandbox):
    from gpuops.profiles import model as profiles

    argv = interactive.ssh_argv(profiles.resolve("sandbox"), forwards=[interactive.forward("8000:8888")],
                                command=["nvidia-smi"])
    joined = " ".join(argv)
    assert "StrictHostKeyChecking=yes" in joined and str(Path(os.environ["GPUOPS_CONFIG_DIR"]) / "known_hosts") in joined
    assert "-L 127.0.0.1:8000:127.0.0.1:8888" in joined and "ExitOnForwardFailure=yes" in joined
    assert argv[-3:] == ["127.0.0.1", "--", "nvidia-smi"]
    assert interactive.forward("6006").spec() == "127.0.0.1:6006:127.0.0.1:6006"


def test_a_forward_reaches_a_server_on_the_host(sandbox):
    """-L LOCAL:REMOTE -N: an HTTP server on the host's 127.0.0.1:REMOTE answers on this machine's LOCAL."""
    server = http.server.HTTPServer(("127.0.0.1", 0), Hello)  # the sandbox host is this machine's loopback
    threading.Thread(target=server.serve_forever, daemon=True).start()
    remote, local = server.server_address[1], free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuops", "ssh", "sandbox", "-L", f"{local}:{remote}", "-N"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    try:
        assert through_forward(proc, local) == b"tensorboard-ish"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        server.shutdown()
    assert f"forwarding http://127.0.0.1:{local}" in err, err
    assert proc.returncode == 130, (proc.returncode, err)


def test_a_forward_killed_with_sigterm_takes_its_ssh_along(sandbox):
    """`gpuops ssh -L ... -N &` then `kill $!` in a script: SIGTERM reaches gpuops alone (not its process group), and
    its ssh must not stay behind as an orphan holding the port and the tunnel."""
    server = http.server.HTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    remote, local = server.server_address[1], free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuops", "ssh", "sandbox", "-L", f"{local}:{remote}", "-N"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert through_forward(proc, local) == b"tensorboard-ish"
        proc.terminate()
        proc.communicate(timeout=20)
        assert proc.returncode == 143, proc.returncode  # 128 + SIGTERM, as a shell reports it
        gone, deadline = False, time.monotonic() + 10
        while time.monotonic() < deadline and not gone:
            try:
                socket.create_connection(("127.0.0.1", local), timeout=2).close()
                time.sleep(0.2)
            except OSError:
                gone = True
        assert gone, "the forward outlived gpuops: its ssh was left running"
    finally:
        if proc.poll() is None:
            proc.kill()
        server.shutdown()


def test_a_changed_host_key_is_refused_with_exit_3(sandbox):
    from support.helpers import record_another_host_key

    kh, pub = record_another_host_key(sandbox["port"])
    p = gpuops_proc("ssh", "sandbox", "--", "echo should-not-run")
    assert p.returncode == 3, p.stderr
    assert "CHANGED" in p.stderr and "gpuops trust sandbox --reset" in p.stderr
    assert "should-not-run" not in p.stdout
    assert kh.read_text().split()[-1] == pub[1]  # the recorded key is kept


def test_on_a_fleet_node_n_is_that_host(sandbox):
    data = yaml.safe_load(sandbox["profile"].read_text())
    dead = free_port()  # nothing listens: rank 0 is unreachable, rank 1 is the sandbox
    data.pop("host")
    port = data.pop("port")
    data["hosts"] = [{"host": "127.0.0.1", "port": dead}, {"host": "127.0.0.1", "port": port}]
    (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "pair.yaml").write_text(yaml.safe_dump(data))
    p = gpuops_proc("ssh", "pair", "--node", "1", "--", "echo node-one")
    assert p.returncode == 0 and p.stdout.strip() == "node-one", p.stderr
    p = gpuops_proc("ssh", "pair", "--", "echo node-zero")
    assert p.returncode == 3 and "node-zero" not in p.stdout and "`gpuops ssh` tried" in p.stderr, p.stderr
    p = gpuops_proc("ssh", "pair", "--node", "2", "--", "true")
    assert p.returncode == 2 and "2 host(s)" in p.stderr
    assert "--node 2:" in p.stderr and "--host" not in p.stderr, p.stderr  # the option as the user typed it


@pytest.mark.parametrize("argv,says", [
    (["ssh", "-L", "nope", "-N"], "not a port"),
    (["ssh", "-L", "1:2:3"], "[LOCAL:]REMOTE"),
    (["ssh", "-N"], "-N without -L"),
    (["ssh", "sandbox", "other"], "a command goes after --"),
    (["ssh", "-L", "6006", "-N", "--", "ls"], "takes no command"),
])
def test_bad_command_lines_are_one_message_with_exit_2(sandbox, gpuops, argv, says):
    r = gpuops(*argv)
    assert r.code == 2 and says in r.err and "Traceback" not in r.err, r.all


def test_the_profile_name_completes(sandbox):
    p = subprocess.run([sys.executable, "-m", "gpuops"], env={**os.environ, "_GPUOPS_COMPLETE": "complete_bash",
                                                              "COMP_WORDS": "gpuops ssh sa", "COMP_CWORD": "2"},
                       capture_output=True, text=True, timeout=60)
    assert "sandbox" in p.stdout.split(), (p.stdout, p.stderr)
