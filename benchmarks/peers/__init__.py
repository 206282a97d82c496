"""The engines mlcpipe is compared with: PyTorch CPU (torch_llama) and llama.cpp (llama_cpp)."""
