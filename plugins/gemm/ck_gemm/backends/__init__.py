"""Backends of the GEMM op: one subpackage per backend that has kernels of its own."""
