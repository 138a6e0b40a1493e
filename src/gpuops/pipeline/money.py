"""`gpuops run` and money, the pure half: a run's TTL (every run's instance has one) and what may be said of an
instance the run could not terminate. No I/O; the runner (pipeline/runner.py) says it."""
from __future__ import annotations

from typing import Optional

DEFAULT_RUN_TTL = "24h"  # a run's instance outlives no closed laptop by more than this (`gpuops reap`, --guard)
RUN_TTL_ENV = "GPUOPS_RUN_TTL"


def run_ttl(given: Optional[str], env: dict) -> tuple[float, str]:
    """A new run's TTL: --ttl, else GPUOPS_RUN_TTL (the environment or ./.env), else 24h. Every run's instance has
    one (a tag on it and in the ledger that `gpuops reap` and --guard on-instance enforce). (seconds, the
    sentence that states it)."""
    from ..cloud import decisions as d
    from ..errors import UsageError

    def parse(text: str, flag: str) -> float:
        try:
            return d.parse_limit(text, flag)
        except UsageError as exc:  # "leave the option out" would not mean "no limit" here
            said = exc.message if exc.message.startswith(flag) else f"{flag}={text}: {exc.message}"
            raise UsageError(said, hint=f"every run's instance has a TTL (default {DEFAULT_RUN_TTL}); a long run: "
                                        "--ttl 7d") from None

    if given is not None:
        secs = parse(given, "--ttl")
        return secs, f"TTL {given} (--ttl)"
    if env.get(RUN_TTL_ENV):
        secs = parse(env[RUN_TTL_ENV], RUN_TTL_ENV)
        return secs, f"TTL {env[RUN_TTL_ENV]} ({RUN_TTL_ENV}; --ttl changes it)"
    secs = d.parse_limit(DEFAULT_RUN_TTL, "--ttl")
    return secs, (f"TTL {DEFAULT_RUN_TTL}, the default (--ttl DURATION or {RUN_TTL_ENV} in the environment "
                  "or ./.env changes it)")


def billing_said(ids: list, seen: dict, price_per_hour: float) -> tuple[str, bool]:
    """What a run may say of instances it could not terminate: (text, billing). STILL BILLING unless the API last
    showed every one of them ended (preempted, terminated, terminating: `seen` = {id: (status, when)}); then what is
    known (that status, when) and what is not (the end is unconfirmed)."""
    from datetime import datetime, timezone

    last = [(i, seen.get(i)) for i in ids]
    if last and all(s is not None and s[0] in ("preempted", "terminated", "terminating") for _, s in last):
        shown = ", ".join(f"{i} {s[0]} at {datetime.fromtimestamp(s[1], timezone.utc):%H:%M:%S UTC}" for i, s in last)
        return (f"the Lambda API last showed {shown}, so it should not bill; that it ended is not confirmed, since the "
                "API could not be asked again"), False
    return f"STILL BILLING ${price_per_hour:.2f}/h", True


# -- --max-cost: what the cap covers ---------------------------------------------------------------------------------
# The cap covers every instance's time from its launch request to its confirmed termination (price x nodes x time),
# what follows a stop included: stopping the job, fetching the log and the --fetch names (verified), terminating. So a
# run stops when what it spent plus what that tail will bill reaches the cap (issue 42: --max-cost 0.03 ended at
# $0.0313, the fetch and the termination after the stop billing on top).
ROUND_S = 2.0  # one connection and one remote execution, before this run measured one (its sync stage)
TERMINATE_S = 6.0  # the API's terminate and the status that confirms it, before the run knows its cloud's poll
FETCH_FLOOR_S = 6.0  # a final fetch of a small folder on a loaded machine: 5.8 s seen (1.4 s quiet), over a fast link


def tail_s(round_s: Optional[float], names: int, last_fetch_s: Optional[float], sample_s: float,
           terminate_s: Optional[float] = None) -> float:
    """The seconds a run bills after it decides to stop: the next sample (the check runs once per event), stopping
    the job (a round: a connection and an execution, as this run's sync measured it), fetching the log (two
    rounds), each --fetch name (six rounds: its connection, the listing, rsync's own connection, rsync and its
    verification; twice the last fetch's measured time when longer; FETCH_FLOOR_S at least), the termination (`terminate_s`: a poll of
    the API and a round trip, else TERMINATE_S). Why so much room: a loaded machine or network makes the final fetch
    take several times what the same run measured before: a fetch of 4.9 s against 1.2 s left for it took a
    fresh-clone CI run's cap from $0.03 to $0.0306 (two rounds each then), and 5.8 s after a 0.4 s sync to $0.0314
    (four rounds, no fetch measured before; the same fetch takes 1.4 s on the quiet machine). Stopping a few seconds early costs the job those seconds; going over
    the cap costs the user money they said they would not spend."""
    r = round_s if round_s is not None and round_s > 0 else ROUND_S
    each = max(6 * r, 2 * (last_fetch_s or 0.0), FETCH_FLOOR_S)
    return sample_s + r + 2 * r + names * each + (terminate_s if terminate_s is not None else TERMINATE_S)


def covers(cap: float) -> str:
    """What --max-cost counts, as the summary and the stop say it."""
    return (f"the cap covers every instance from its launch request to its confirmed termination: ${cap:.2f} "
            "with the job's stop, the final fetch and the termination, which the run leaves room for when it stops")
