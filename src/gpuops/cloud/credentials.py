"""Where the Lambda API key comes from: LAMBDA_API_KEY (environment, then ./.env), else ~/.lambda_cloud/lambda_keys
(`api_key = ...`, the file SkyPilot also reads). A file holding the key (lambda_keys, or the .env it came from) must be
readable by its owner only. The key is checked as it is loaded: a trailing line break (a key file's, a CRLF) is
dropped; a key with a line break, control character, space or non-ASCII character inside is refused (exit 2), naming
where it came from, never its value. The API base URL can be moved with GPUOPS_LAMBDA_API_URL (the local emulator,
tests)."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from ..errors import AuthError, UsageError
from ..paths import loose_mode
from .api import LAMBDA_API_URL, Secret, key_problem

KEY_FILE = Path("~/.lambda_cloud/lambda_keys")
KEY_HINT = ("put the key on one line, exactly as https://cloud.lambda.ai/api-keys shows it, with an editor (not on a "
            "command line)")


def key_file() -> Path:
    return KEY_FILE.expanduser()


def parse_key_file(text: str) -> str | None:
    """`api_key = VALUE` (SkyPilot's format); other lines ignored."""
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip() == "api_key" and v.strip():
            return v.strip().strip("'\"")
    return None


def checked_key(value: str, source: str) -> Secret:
    """The key without the line break (or spaces) around it that a key file, a CRLF or a paste leaves; refused
    (UsageError, exit 2) when what is left cannot be a key. The message names the source, never the value."""
    secret = Secret(value)  # registered for redaction before anything can print it, refused or not
    value = value.strip()
    problem = key_problem(value)
    if problem:
        raise UsageError(f"the Lambda API key from {source} is not usable: {problem}", hint=KEY_HINT)
    return Secret(value)


def private_file(path: Path, what: str) -> None:
    """Refuse (exit 3, with the chmod that fixes it) a file holding the key that group or others can read."""
    mode = loose_mode(path)
    if mode is not None:
        raise AuthError(f"{path} is readable by others (mode {mode:04o}); gpuops will not use {what} others can read",
                        hint=f"chmod 600 {shlex.quote(str(path))}")


def load_api_key(project_dir: Path | None = None) -> tuple[Secret, str]:
    """(key, where it came from). Raises AuthError (exit 3) when there is none or the file holding it is not private,
    UsageError (exit 2) when its file is not a file or the key is malformed."""
    from ..profiles.model import read_dotenv

    if os.environ.get("LAMBDA_API_KEY"):
        return checked_key(os.environ["LAMBDA_API_KEY"], "LAMBDA_API_KEY"), "LAMBDA_API_KEY"
    dot = (project_dir or Path.cwd()) / ".env"
    value = read_dotenv(dot).get("LAMBDA_API_KEY")
    if value:
        private_file(dot, "an API key in a .env")
        return checked_key(value, f"LAMBDA_API_KEY in {dot}"), f"LAMBDA_API_KEY in {dot}"
    f = key_file()
    if f.is_file():
        private_file(f, "an API key")
        try:
            value = parse_key_file(f.read_text(encoding="utf-8", errors="replace"))
        except OSError as exc:
            raise UsageError(f"cannot read {f}: {exc.strerror}") from None
        if value:
            return checked_key(value, str(f)), str(f)
        raise AuthError(f"{f} has no 'api_key = ...' line")
    if os.path.lexists(f):
        what = ("a folder" if f.is_dir() else "a link to a missing file" if f.is_symlink() and not f.exists()
                else "not a regular file")
        raise UsageError(f"{f} is {what}; the API key goes in a file of that name, with a line 'api_key = YOUR_KEY'",
                         hint=f"move it away, then write the file with an editor and chmod 600 {shlex.quote(str(f))}")
    raise AuthError("no Lambda API key: set LAMBDA_API_KEY (environment or ./.env) or write ~/.lambda_cloud/lambda_keys",
                    hint="create a key at https://cloud.lambda.ai/api-keys and put the line 'api_key = YOUR_KEY' in "
                         "~/.lambda_cloud/lambda_keys with an editor (not on a command line), then chmod 600 it")


def base_url() -> str:
    return (os.environ.get("GPUOPS_LAMBDA_API_URL") or LAMBDA_API_URL).rstrip("/")


def is_production(url: str) -> bool:
    """Lambda's real service (its limits apply in full); anything else is an emulator or a test server."""
    from urllib.parse import urlparse

    host = urlparse(url).hostname or ""
    return host.endswith("lambda.ai") or host.endswith("lambdalabs.com")
