"""Run a command while other processes keep the machine's cores busy in bursts, as on a shared host.

    python benchmarks/bursty_load.py [--per-core N] [--burst-ms LO HI] -- COMMAND ...

Each of N processes per core (default 2, so the cores are oversubscribed while the bursts last)
spins for a random LO..HI ms, then sleeps for a random LO..HI ms, again and again, until the
command ends; then they are stopped, and this exits with the command's exit code. A steady busy
loop is not enough to find a lesson that only passes on an idle machine: the scheduler shares a
steady load fairly, while bursts starve a process for a while and then let it run, which is what
breaks a check that compares two timings. ``make test-busy`` runs every lesson under it; CI runs
the Colab-like environment's lessons under it (``.ci/env-colab``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import subprocess
import sys
import time


def burn(lo_ms: float, hi_ms: float, seed: int) -> None:
    """Spin, then sleep, each for a random time between lo_ms and hi_ms, forever."""
    rng = random.Random(seed)
    while True:
        end = time.perf_counter() + rng.uniform(lo_ms, hi_ms) / 1000
        while time.perf_counter() < end:
            pass
        time.sleep(rng.uniform(lo_ms, hi_ms) / 1000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-core", type=int, default=2, help="busy processes per core (default 2)")
    parser.add_argument("--burst-ms", type=float, nargs=2, default=(20.0, 400.0), metavar=("LO", "HI"),
                        help="each burst and each pause lasts a random LO..HI milliseconds (default 20 400)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- python -m pytest lessons")
    if args.per_core < 1:
        parser.error(f"--per-core {args.per_core}: give 1 or more busy processes per core")
    lo, hi = args.burst_ms
    if not 0 < lo <= hi:
        parser.error(f"--burst-ms {lo:g} {hi:g}: give two lengths in ms, 0 < LO <= HI")
    count = args.per_core * (os.cpu_count() or 1)
    seed = int(time.time())
    print(f"bursty load: {count} processes on {os.cpu_count()} cores, bursts and pauses of {lo:g}-{hi:g} ms "
          f"(seed {seed})", flush=True)
    workers = [multiprocessing.Process(target=burn, args=(lo, hi, seed + i), daemon=True) for i in range(count)]
    for worker in workers:
        worker.start()
    try:
        return subprocess.call(command)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
