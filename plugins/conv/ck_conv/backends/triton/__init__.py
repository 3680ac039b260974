"""The triton backend of grouped convolution: kernels and their launchers."""
