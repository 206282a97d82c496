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
PER_CPU = 4  # at most this many threads per CPU: TVM's pool spins, so more only slow it (thousands hang or abort it)
_defaulted: str | None = None  # the count configure() chose itself (no --threads, no $TVM_NUM_THREADS), as set


def available() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def for_worker(sharing: int) -> str:
    """TVM_NUM_THREADS for a worker process that shares the machine with `sharing` - 1 others:
    the user's count where one was given (--threads, $TVM_NUM_THREADS), else the CPUs split
    between them (a default of every CPU in each would oversubscribe TVM's spinning pools)."""
    current = os.environ.get(ENV, "").strip()
    if current and current != _defaulted:
        return current
    return str(max(1, available() // max(1, sharing)))


def configure(threads: int | None = None) -> int:
    """Set TVM_NUM_THREADS for this process (before TVM's pool starts) and return the count."""
    global _defaulted
    previous, _defaulted = _defaulted, None
    limit = PER_CPU * available()
    if threads is not None and not 1 <= threads <= limit:
        raise ValueError(f"--threads: got {threads}, expected 1 to {limit} ({PER_CPU} per CPU this process may run on)")
    if threads is None:
        current = os.environ.get(ENV, "").strip()
        if current:
            if not (current.isascii() and current.isdigit() and 1 <= int(current) <= limit):
                raise ValueError(f"environment {ENV}={os.environ[ENV]!r}: expected a number of threads from 1 to {limit} "
                                 f"({PER_CPU} per CPU this process may run on), or unset it")
            if current == previous:  # the count an earlier call chose itself (e.g. MetaSchedule's after the CLI's)
                _defaulted = previous
            return int(current)
        threads = available()
        _defaulted = str(threads)
    os.environ[ENV] = str(threads)
    return threads
