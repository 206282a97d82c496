"""How many CPU threads TVM's runtime thread pool uses.

TVM sizes its pool at first use from TVM_NUM_THREADS, else from the hardware concurrency halved
on x86 (it assumes two hyper-threads per core): on this project's 2-vCPU machines (one thread per
core) that is a single thread, half the machine. `mlcpipe` therefore sets TVM_NUM_THREADS before
anything runs: `--threads N` if given, else the variable as the user set it, else every CPU this
process may run on.
"""

from __future__ import annotations

import os

ENV = "TVM_NUM_THREADS"


def configure(threads: int | None = None) -> int:
    """Set TVM_NUM_THREADS for this process (before TVM's pool starts) and return the count."""
    if threads is not None and threads < 1:
        raise ValueError(f"--threads: got {threads}, expected a positive number of threads")
    if threads is None:
        current = os.environ.get(ENV, "").strip()
        if current:
            if not (current.isascii() and current.isdigit() and int(current) > 0):
                raise ValueError(f"environment {ENV}={os.environ[ENV]!r}: expected a positive number of threads (or unset it)")
            return int(current)
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ[ENV] = str(threads)
    return threads
