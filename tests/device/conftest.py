import pytest


@pytest.fixture(scope="session")
def tiny_llvm_q4f32():
    """llama-tiny q4f32_1 built for this CPU (the build cache's, shared with other tests)."""
    from mlcpipe.interface.artifacts import ensure_artifact

    return ensure_artifact("llama-tiny", "q4f32_1", "llvm", log=lambda *_: None)
