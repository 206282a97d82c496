"""What the tests share that is not a test: test data, checkpoints, reference implementations,
checks used by more than one test module, and the machine's hardware (tests/conftest.py's markers).
A test module imports from here, never from another test module (tests/test_layout.py checks it)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository root (pipeline/, schedules/, tests/)
