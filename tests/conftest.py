import os

import pytest

# Tests share the two cores; TVM's thread pool would otherwise oversubscribe.
os.environ.setdefault("TVM_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def tiny_config():
    from pipeline.config import load_model_config

    return load_model_config("llama-tiny")
