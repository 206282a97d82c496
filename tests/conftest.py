import os

import pytest

from tests.helpers import hardware

# Tests share the cores (with `-n N`, N pytest workers do); TVM's thread pool would otherwise
# oversubscribe them. Subprocesses the tests start inherit it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
os.environ.setdefault("TVM_NUM_THREADS", str(max(1, min(2, (os.cpu_count() or 2) // _WORKERS))))


@pytest.fixture(scope="session")
def tiny_config():
    from mlcpipe.config import load_model_config

    return load_model_config("llama-tiny")


# ---- hardware markers (tests/helpers/hardware.py, docs/tests.md) --------------------------------


def pytest_collection_modifyitems(config, items):
    """A hardware marker takes no argument but `skip_if_missing=True`."""
    for item in items:
        for name in hardware.PROBES:
            for marker in item.iter_markers(name):
                if marker.args or set(marker.kwargs) - {"skip_if_missing"}:
                    raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name} takes only skip_if_missing=True")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Skip, in one line, a test whose marker asks for it where this machine lacks what it needs."""
    for name, probe in hardware.PROBES.items():
        marker = item.get_closest_marker(name)
        if marker is None:
            continue
        if name in hardware.ALWAYS_SKIPPED_WHERE_MISSING or any(m.kwargs.get("skip_if_missing") for m in item.iter_markers(name)):
            missing = probe()
            if missing is not None:
                pytest.skip(f"needs {name}: {missing}")
