"""The local sandbox host: a real sshd on 127.0.0.1 and an emulated nvidia-smi (the only emulated part)."""
