"""mlcpipe sizes TVM's CPU thread pool itself (TVM's own default halves the vCPUs on x86)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlcpipe import threads

PROBE = (
    "import sys; from mlcpipe.threads import configure; n = configure({arg}); "
    "import tvm; print(n, tvm.get_global_func('runtime.NumThreads')())"
)


def _probe(arg: str, env_value: str | None) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if k != threads.ENV}
    if env_value is not None:
        env[threads.ENV] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE.format(arg=arg)], capture_output=True, text=True, env=env, check=True)
    configured, pool = out.stdout.split()
    return int(configured), int(pool)


def test_default_is_every_available_cpu_and_tvm_uses_it():
    cpus = len(os.sched_getaffinity(0))
    assert _probe("None", None) == (cpus, cpus)


def test_explicit_count_and_environment():
    cpus = len(os.sched_getaffinity(0))
    assert _probe("1", None) == (1, 1)
    assert _probe("None", "1") == (1, 1)  # the user's TVM_NUM_THREADS is kept
    assert _probe(str(cpus), "1") == (cpus, cpus)  # --threads wins over it


def test_bad_count_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(threads.ENV, raising=False)
    with pytest.raises(ValueError, match="--threads: got 0"):
        threads.configure(0)
    out = subprocess.run([sys.executable, "-m", "mlcpipe.cli", "--threads", "0", "run", "--artifact", "x"], capture_output=True, text=True)
    assert out.returncode == 2 and "--threads" in out.stderr


def test_more_threads_than_the_machine_can_spin_are_refused(monkeypatch):
    """Was: `--threads 100000` aborted in TVM's pool ('terminate called without an active
    exception', exit 134) and 2000 hung at exit; now one line, before TVM starts."""
    monkeypatch.delenv(threads.ENV, raising=False)
    limit = threads.PER_CPU * len(os.sched_getaffinity(0))
    assert threads.configure(limit) == limit
    with pytest.raises(ValueError, match=rf"^--threads: got {limit + 1}, expected 1 to {limit} "):
        threads.configure(limit + 1)
    out = subprocess.run([sys.executable, "-m", "mlcpipe.cli", "--threads", "100000", "run", "--artifact", "x"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"error: --threads: got 100000, expected 1 to {limit} "
                                                                        f"({threads.PER_CPU} per CPU this process may run on)"]
    env = {**os.environ, threads.ENV: "100000"}
    out = subprocess.run([sys.executable, "-m", "mlcpipe.cli", "run", "--artifact", "x"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and f"environment {threads.ENV}='100000': expected a number of threads from 1 to {limit}" in out.stderr


def test_workers_split_the_cpus_unless_the_user_chose(monkeypatch):
    """Concurrent nightly cells: was every CPU in every worker once the CLI had set TVM_NUM_THREADS
    for itself (2 cells on 2 CPUs: 4 spinning threads); a profile, alone on the machine, gets them all."""
    from mlcpipe.nightly.runner import Runner

    cpus = threads.available()
    monkeypatch.delenv(threads.ENV, raising=False)
    monkeypatch.setattr(threads, "_defaulted", None)
    assert threads.configure(None) == cpus  # what the CLI does first
    assert threads.configure(None) == cpus  # and a later call in the same process (tune's MetaSchedule) keeps it mlcpipe's choice
    runner = Runner([object(), object(), object()], Path("out"), Path("cache"), jobs=2)
    assert runner._env(alone=False)[threads.ENV] == str(max(1, cpus // 2))
    assert runner._env(alone=True)[threads.ENV] == str(cpus)
    assert Runner([object()], Path("out"), Path("cache"), jobs=8)._env(alone=False)[threads.ENV] == str(cpus)  # one cell: all
    monkeypatch.setenv(threads.ENV, "3")  # the user's count is kept, in every worker
    assert threads.configure(None) == 3
    assert runner._env(alone=False)[threads.ENV] == runner._env(alone=True)[threads.ENV] == "3"
    assert threads.configure(1) == 1 and runner._env(alone=False)[threads.ENV] == "1"  # --threads 1
