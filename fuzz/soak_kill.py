"""Soak test: SIGKILL saving processes at many random points, check what is left.

    .venv/bin/python fuzz/soak_kill.py --minutes 5 [--dir /tmp/soak]

Each round starts a child that saves 60 000 small elements in 40 shards
(alternately to a fresh path and over an existing dataset, half of the rounds
with ``resume=True``), kills it with SIGKILL after a random number of complete
shards plus a random delay (or lets it finish), then checks: the fresh path
holds nothing or the complete new dataset; the overwritten path holds the old
dataset bit for bit or the complete new one; a resumed save completes to an
exact copy. Prints one summary line; exits non-zero on the first violation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

log = logging.getLogger("soak_kill")

N, SHARDS = 60_000, 40
CHILD = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf, superserial
ds = tf.data.Dataset.range({start}, {start} + {n}).map(lambda i: (i, tf.strings.as_string(i)))
superserial.save(ds, {path!r}, num_shards={shards}, overwrite=True, resume={resume})
"""


def _digest(path: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def _first_and_count(path: str) -> tuple[int, int]:
    import superserial

    header = superserial.read_header(path)
    first = next(iter(superserial.load(path, batch_size=1)))[0].numpy()[0]
    return int(first), header.element_count


def _done(partial: str) -> int:
    try:
        with open(os.path.join(partial, "progress.json")) as f:
            return len(json.load(f)["shards"])
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def main() -> int:
    """Runs rounds until the time is up; returns the exit status."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    base = args.dir or tempfile.mkdtemp(prefix="soak-")
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import superserial

    end = time.monotonic() + args.minutes * 60
    stats = {
        "rounds": 0,
        "killed": 0,
        "finished": 0,
        "resumed": 0,
        "old_intact": 0,
        "absent": 0,
        "new_whole": 0,
    }
    rnd = 0
    while time.monotonic() < end:
        rnd += 1
        path = os.path.join(base, f"ds{rnd}")
        partial = os.path.join(base, f".ds{rnd}.superserial-partial")
        overwrite = rnd % 2 == 0
        resume = rng.random() < 0.5
        before = None
        if overwrite:
            import tensorflow as tf

            old = tf.data.Dataset.range(7).map(lambda i: (i, tf.strings.as_string(i)))
            superserial.save(old, path)
            before = _digest(path)
        code = CHILD.format(start=10**6, n=N, path=path, shards=SHARDS, resume=resume)
        proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
        target = rng.randint(0, SHARDS + 2)  # > SHARDS: let it finish
        while proc.poll() is None and _done(partial) < target:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.3))
        killed = proc.poll() is None
        if killed:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        stats["rounds"] += 1
        stats["killed" if killed else "finished"] += 1
        if os.path.isdir(path):
            if before is not None and _digest(path) == before:
                stats["old_intact"] += 1
            else:
                first, count = _first_and_count(path)
                if (first, count) != (10**6, N):
                    log.error("round %d: %s holds neither the old nor the new dataset", rnd, path)
                    return 1
                stats["new_whole"] += 1
        elif before is not None:
            log.error("round %d: the old dataset at %s is gone", rnd, path)
            return 1
        else:
            stats["absent"] += 1
        if killed and resume and os.path.isdir(partial) and _done(partial):
            import tensorflow as tf

            ds = tf.data.Dataset.range(10**6, 10**6 + N).map(lambda i: (i, tf.strings.as_string(i)))
            superserial.save(ds, path, num_shards=SHARDS, overwrite=True, resume=True)
            got = [int(x) for b in superserial.load(path, batch_size=8192) for x in b[0].numpy()]
            if got != list(range(10**6, 10**6 + N)):
                log.error("round %d: the resumed save differs from the source", rnd)
                return 1
            stats["resumed"] += 1
        superserial.cleanup(path)
        shutil.rmtree(path, ignore_errors=True)
    log.info("soak: %s, no violation", stats)
    print(json.dumps(stats))  # noqa: T201
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
