"""What the real wandb library wrote offline: the records of a run file (snapshot tests)."""
from __future__ import annotations

import json
import struct
from pathlib import Path


# -- W&B, real library, offline --------------------------------------------------------------------------------
def wandb_records(run_dir: Path):
    """Records of an offline run's .wandb file (W&B's LevelDB-style log of protobuf Records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            whole = chunk
        elif kind == 2:
            buf = chunk
            continue
        elif kind == 3:
            buf += chunk
            continue
        else:
            whole, buf = buf + chunk, b""
        rec = pb.Record()
        rec.ParseFromString(whole)
        yield rec.WhichOneof("record_type"), rec


def wandb_artifact_and_config(run_dir: Path) -> tuple:
    import time

    deadline = time.monotonic() + 10
    records = list(wandb_records(run_dir))
    while not any(kind == "exit" for kind, _ in records) and time.monotonic() < deadline:
        time.sleep(0.2)  # the run file is complete once its exit record is there
        records = list(wandb_records(run_dir))
    arts, config = [], {}
    for kind, rec in records:
        if kind == "artifact":
            arts.append(rec.artifact)
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in rec.config.update})
    return arts, config
