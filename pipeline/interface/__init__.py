"""The work behind the commands (MLC-LLM's `interface/`): `pipeline/cli/` parses arguments and
calls one function here per command."""

from __future__ import annotations


def configure_process(threads: int | None) -> None:
    """What every command needs first: its configs folder, TVM's thread count (`--threads`, pipeline/threads.py)."""
    from ..config import check_config_dir
    from ..threads import configure

    check_config_dir()
    configure(threads)
