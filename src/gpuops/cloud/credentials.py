"""Where the Lambda API key comes from: LAMBDA_API_KEY (environment, then ./.env), else ~/.lambda_cloud/lambda_keys
(`api_key = ...`, the file SkyPilot also reads), which must be readable by its owner only. The API base URL can be
moved with GPUOPS_LAMBDA_API_URL (the local emulator, tests)."""
from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

from ..errors import AuthError
from .api import LAMBDA_API_URL, Secret

KEY_FILE = Path("~/.lambda_cloud/lambda_keys")


def key_file() -> Path:
    return KEY_FILE.expanduser()


def parse_key_file(text: str) -> str | None:
    """`api_key = VALUE` (SkyPilot's format); other lines ignored."""
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip() == "api_key" and v.strip():
            return v.strip().strip("'\"")
    return None


def load_api_key(project_dir: Path | None = None) -> tuple[Secret, str]:
    """(key, where it came from). Raises AuthError (exit 3) when there is none or its file is not private."""
    from ..profiles import read_dotenv

    if os.environ.get("LAMBDA_API_KEY"):
        return Secret(os.environ["LAMBDA_API_KEY"].strip()), "LAMBDA_API_KEY"
    dot = (project_dir or Path.cwd()) / ".env"
    value = read_dotenv(dot).get("LAMBDA_API_KEY")
    if value:
        return Secret(value.strip()), f"LAMBDA_API_KEY in {dot}"
    f = key_file()
    if f.is_file():
        mode = stat.S_IMODE(f.stat().st_mode)
        if mode & 0o077:
            raise AuthError(f"{f} is readable by others (mode {mode:04o}); gpuops will not use an API key others can read",
                            hint=f"chmod 600 {shlex.quote(str(f))}")
        value = parse_key_file(f.read_text(encoding="utf-8", errors="replace"))
        if value:
            return Secret(value), str(f)
        raise AuthError(f"{f} has no 'api_key = ...' line")
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
