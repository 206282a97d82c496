"""`python -m pipeline.cli`: the `mlcpipe` command."""

from . import main

main()
