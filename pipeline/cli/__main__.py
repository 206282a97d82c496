"""`python -m mlcpipe.cli`: the `mlcpipe` command."""

from . import main

main()
