"""slurm/commands.py with a stand-in connection: what it sends (every word quoted, one execution), how it reads."""
from __future__ import annotations

import pytest

from gpuops.errors import RemoteError, UsageError
from gpuops.remote.connection import Result
from gpuops.slurm.commands import LoginNode


class Remote:
    def __init__(self, *answers):
        self.answers, self.asked = list(answers), []

    def run(self, command, *, timeout=30, stdin=None):
        self.asked.append((command, stdin))
        rc, out = self.answers.pop(0) if self.answers else (0, "")
        return Result(rc, out, "", 0.0)


def test_a_home_relative_shared_folder_is_made_absolute_once():
    node = LoginNode(Remote((0, "/home/me")))
    assert node.absolute("~/proj") == "/home/me/proj" and node.absolute("~") == "/home/me"
    assert node.absolute("/shared/x/") == "/shared/x" and len(node.remote.asked) == 1
    with pytest.raises(UsageError):
        LoginNode(Remote()).absolute("relative/dir")


def test_submit_is_one_execution_secrets_only_in_a_0600_file_and_sbatchs_words_said():
    remote = Remote((0, "@sbatch 0\n4242\n"))
    job_id = LoginNode(remote).submit(run_dir="/s/p/.gpuops/runs/r 1", files={"job.sbatch": "#!/bin/bash\n"},
                                      secrets={"TOKEN": "v'al;ue"}, sbatch=["sbatch", "--parsable", "/s/x y.sbatch"],
                                      project_dir="/s/p", script_rel="train.py")
    assert job_id == "4242" and len(remote.asked) == 1
    command, script = remote.asked[0]
    assert command == "sh -s" and "v'al;ue" not in command  # the secret is in the script on stdin, in a heredoc
    assert "umask 077" in script and 'chmod 600 "$D/secrets.env"' in script
    assert "D='/s/p/.gpuops/runs/r 1'" in script and "sbatch --parsable '/s/x y.sbatch'" in script
    refused = Remote((0, "@sbatch 1\nsbatch: error: invalid partition specified: nosuch\n"))
    with pytest.raises(RemoteError, match="invalid partition"):
        LoginNode(refused).submit(run_dir="/r", files={}, secrets={}, sbatch=["sbatch"], project_dir="/p")
    with pytest.raises(UsageError, match="train.py is not in /p"):
        LoginNode(Remote((0, "@noscript\n"))).submit(run_dir="/r", files={}, secrets={}, sbatch=["sbatch"],
                                                     project_dir="/p", script_rel="train.py")
