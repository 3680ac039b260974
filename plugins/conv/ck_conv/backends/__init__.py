"""Backends of the conv op: one subpackage per backend that has kernels of its own."""
