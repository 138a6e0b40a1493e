"""SSH keys for the cloud: the user's key (checked, its public line, registered with Lambda once) and the
instance's host key (made here, given to the instance in user_data, pinned in gpuops' known_hosts)."""
from __future__ import annotations

from pathlib import Path

from ..errors import AuthError, UsageError
from . import decisions as d
from .api import Client, LambdaError


# -- keys --------------------------------------------------------------------------------------------------------
def require_key(key: Path, *, given: bool = True) -> None:
    """The private key `up` and `run` register with the account must exist; the hint says how to make one (no
    profile exists yet to point elsewhere)."""
    if key.exists():
        return
    import shlex

    raise UsageError(f"key file not found: {key}" if given else f"no SSH key given and {key} does not exist",
                     hint=f"create one: mkdir -p -m 700 {shlex.quote(str(key.parent))} && "
                          f"ssh-keygen -t ed25519 -f {shlex.quote(str(key))} -N ''   (or --key PATH to a private key "
                          "you have)")


def public_key_of(key: Path) -> str:
    """The OpenSSH public line of a private key file (its .pub if present, else derived): the key `up`/`run` launch
    with, given by --key (no profile names it yet)."""
    from ..remote.connection import check_key_file

    require_key(key)
    check_key_file(key)
    pub = Path(str(key) + ".pub")
    if pub.is_file():
        line = pub.read_text().strip()
        if line:
            return line
    import paramiko

    try:
        k = paramiko.PKey.from_path(str(key))
    except Exception as exc:
        raise AuthError(f"cannot read the key {key}: {exc}") from exc
    return f"{k.get_name()} {k.get_base64()}"


def ensure_ssh_key(client: Client, public_line: str, out) -> str:
    """The account's name for this key, registering it as gpuops-<fingerprint> when its content is not there."""
    for k in client.ssh_keys():
        if d.same_key(k.public_key, public_line):
            return k.name
    name = d.ssh_key_name(public_line)
    try:
        client.add_ssh_key(name, " ".join(public_line.split()[:2]) + " gpuops")
    except LambdaError as exc:  # another gpuops (a second first `up`) may have registered it a moment ago
        if exc.transient:
            raise
        for k in client.ssh_keys():
            if d.same_key(k.public_key, public_line):
                return k.name
        raise
    out.info(f"registered SSH key {name} ({d.fingerprint(public_line)}) on the Lambda account")
    return name


def make_host_key() -> tuple[str, str]:
    """A fresh ed25519 host key for the instance: (OpenSSH private PEM, public line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    k = Ed25519PrivateKey.generate()
    priv = k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                           serialization.NoEncryption()).decode()
    pub = k.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return priv, pub


class _PubKey:
    """What hostkeys.record needs of a key."""

    def __init__(self, line: str):
        self._type, self._b64 = d.key_blob(line)

    def get_name(self) -> str:
        return self._type

    def get_base64(self) -> str:
        return self._b64


def pin_host_key(ip: str, port: int, public_line: str) -> None:
    from ..remote import hostkeys

    # Lambda recycles IPs: an old pin for this address belongs to another machine. One step under the file's lock
    # (forget, then record, left a moment in which another gpuops could record the gone instance's key between them)
    hostkeys.replace(ip, port, _PubKey(public_line))
