"""The usual slips on a command line, explained: a hint after click's own usage error (cli/main.py shows it).

- `gpuops train train.py`: the script was taken as one of the script's arguments, and --script is missing;
- `gpuops train --script s.sh --quick`: an option of the script's given to gpuops; they go after `--`.
Pure: the error click raised and the words typed in, to a hint or None.
"""
from __future__ import annotations

import shlex

SCRIPT_SUFFIXES = (".py", ".sh")


def _words_after(args: list[str], command: str) -> list[str]:
    return args[args.index(command) + 1:] if command in args else list(args)


def hint(exc, args: list[str]) -> str | None:
    """A hint for click's usage error `exc` raised while parsing `args` (the words after `gpuops`), or None."""
    ctx = getattr(exc, "ctx", None)
    command = getattr(getattr(ctx, "command", None), "name", None) or ""
    has_script = any(p.name == "script" for p in getattr(getattr(ctx, "command", None), "params", []) or [])
    if not has_script:
        return None
    words = _words_after(args, command)
    kind = type(exc).__name__
    param = getattr(getattr(exc, "param", None), "name", None)
    given = any(w in ("--script", "-s") or w.startswith("--script=") for w in words)
    cut = words.index("--") if "--" in words else len(words)
    loose = [i for i, w in enumerate(words[:cut]) if not w.startswith("-") and w.endswith(SCRIPT_SUFFIXES)]
    if not given and loose and (kind == "NoSuchOption" or (kind == "MissingParameter" and param == "script")):
        i = loose[0]
        after = [w for w in words[i + 1:] if w != "--"]
        fixed = words[:i] + ["--script", words[i]] + (["--", *after] if after else [])
        return (f"`{words[i]}` was taken as an argument for the script, not as the script: name it with --script: "
                f"gpuops {command} {shlex.join(fixed)}")
    if kind == "NoSuchOption" and given:
        bad = getattr(exc, "option_name", "") or ""
        at = words.index(bad) if bad in words else len(words)
        if at > cut:
            return None
        fixed = words[:at] + ["--", *[w for w in words[at:] if w != "--"]]
        return (f"{bad} is not an option of gpuops {command}; the script's own arguments go after `--`: "
                f"gpuops {command} {shlex.join(fixed)}")
    return None
