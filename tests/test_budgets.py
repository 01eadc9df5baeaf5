"""benchmarks/budgets.py's memory reading: the number the kernel budget (1.2 GB, under Binder's 2 GB limit) is
held to."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import budgets_script


@pytest.mark.light  # starts a plain Python process (no TensorFlow) that stands in for a kernel
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="the high-water mark is Linux's /proc")
def test_a_kernels_peak_counts_though_no_reading_falls_inside_it():
    """A process named like a kernel fills 300 MB, frees it at once, says so, and idles until told to exit: the
    readings taken after the spike (every 0.25 s) see it, because the peak is read from the kernel's
    high-water mark, not from the resident size at the moment of reading (about 10 MB by then)."""
    budgets = budgets_script()
    spike = ("import sys; block = b'x' * (300 * 2**20); del block; print('freed', flush=True); "
             "sys.stdin.read()")
    stop, kernels, totals = threading.Event(), {}, []
    sampler = threading.Thread(target=budgets._sample, args=(psutil.Process(os.getpid()), stop, kernels, totals))
    child = subprocess.Popen([sys.executable, "-c", spike, "ipykernel_launcher"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "freed\n"  # the spike is over before the first reading
        resident_after = psutil.Process(child.pid).memory_info().rss / 2**20
        sampler.start()
        deadline = time.monotonic() + 60  # a busy machine may starve the sampler for a while: wait for two readings
        while time.monotonic() < deadline and len(totals) < 2:
            time.sleep(0.1)
    finally:
        stop.set()
        if sampler.is_alive():
            sampler.join()
        child.communicate("", timeout=60)
    assert resident_after < 100, resident_after  # the spike is gone from the resident size
    [((pid, _started), (_first_seen, peak_mb))] = kernels.items()  # this test's process isn't a kernel; the child is
    assert pid == child.pid and peak_mb >= 300, kernels  # and its spike still counts
    assert all(mb > 0 for _, mb in totals)  # the summed PSS of every process, every second
