"""Backends of the FMHA op: one subpackage per backend that has kernels of its own."""
