"""Benchmarks: mlcpipe against its peers (PyTorch CPU, llama.cpp) in one run; see llm_cpu.py."""
