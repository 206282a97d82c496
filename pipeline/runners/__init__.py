"""Executors that run generated kernels on devices reachable from this machine."""
