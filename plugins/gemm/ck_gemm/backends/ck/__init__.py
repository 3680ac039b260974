"""The ck backend of GEMM: CK Tile C++ rendering of GEMM kernel keys."""
