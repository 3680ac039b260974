"""GemmProblem: C = act(A @ B (op) D0 (op) D1 ...), optionally batched."""
from __future__ import annotations

from typing import ClassVar

import attrs
import numpy as np

from ck_core.dtypes import check_dtype, numpy_storage
from ck_core.errors import InvalidProblem
from ck_core.problem import Problem, as_int, positive

DTYPES = ("fp16", "bf16", "fp32", "fp8", "bf8", "int8")
LAYOUTS = ("rcr", "rrr", "crr", "ccr")
ACTIVATIONS = ("none", "relu", "gelu", "silu", "sigmoid", "tanh")
D_OPS = ("add", "mul")
#: CK's output type per input type
DEFAULT_C = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32", "fp8": "fp16", "bf8": "fp16",
             "int8": "int32"}


def _dtype(instance, attribute, value):
    try:
        check_dtype(value, DTYPES)
    except InvalidProblem as exc:
        raise InvalidProblem(f"GemmProblem.{attribute.name}: {exc}") from None


def _layout(instance, attribute, value):
    if value not in LAYOUTS:
        raise InvalidProblem(f"GemmProblem.layout={value!r} is unknown; use one of {', '.join(LAYOUTS)} "
                             f"(letters give A, B, C storage: r=row-major, c=column-major)")


@attrs.frozen(cache_hash=True)
class GemmProblem(Problem):
    """M x N x K GEMM (times ``batch``), CK layout letters for A, B, C.

    ``rcr`` = A row-major (M x K), B column-major (stored N x K), C row-major.
    Epilogue: ``num_d`` extra tensors shaped like C are combined with the
    accumulator by ``d_op`` (add/mul), then ``activation`` is applied.

    Fields
    ------
    m, n, k       the product's sizes (C is M x N, the reduction runs over K)
    batch         independent products in one launch (tensors gain a leading batch axis)
    dtype         input dtype: fp16, bf16, fp32, fp8, bf8, int8
    dtype_c       output dtype ('' = CK's default for dtype: fp8 -> fp16, int8 -> int32)
    layout        A, B, C storage letters: rcr, rrr, crr, ccr (r = row-major, c = column-major)
    num_d         extra tensors d0..d3 shaped like C fused into the epilogue (0..4)
    d_op          how the D tensors combine with the accumulator: add, mul
    activation    applied last: none, relu, gelu, silu, sigmoid, tanh
    preshuffle    B arrives pre-shuffled (CK's preshuffle GEMM): packed once in a kernel's tile
                  order, ``[ceil(N/pack_n), ceil(K/pack_k), pack_n, pack_k]`` zero-padded, each
                  pack_n x pack_k tile of B (N x K, K contiguous) one contiguous block
                  (:func:`pack_b`; ``ck_gemm.preshuffle`` packs a linear weight).  Layout rcr only,
                  batch 1
    pack_n,       the tile B was packed for; only keys of that N and K tile run the problem.
    pack_k        0 (both) while the tile is still to be chosen: a problem that selects a key
                  (``ck_gemm.preshuffle`` asks the Dispatcher) but cannot run
    """

    op: ClassVar[str] = "gemm"
    m: int = attrs.field(converter=as_int, validator=positive, metadata={
        "help": "rows of A and C (M)"})
    n: int = attrs.field(converter=as_int, validator=positive, metadata={
        "help": "columns of B and C (N)"})
    k: int = attrs.field(converter=as_int, validator=positive, metadata={
        "help": "the reduction length: columns of A, rows of B (K)"})
    batch: int = attrs.field(default=1, converter=as_int, validator=positive, metadata={
        "help": "independent products in one launch (the tensors gain a leading batch axis)"})
    dtype: str = attrs.field(default="fp16", validator=_dtype, metadata={
        "help": f"input dtype of A and B: {', '.join(DTYPES)}"})
    dtype_c: str = attrs.field(default="", validator=attrs.validators.instance_of(str), metadata={
        "help": "output dtype of C ('' = CK's default for dtype: fp8/bf8 -> fp16, int8 -> int32, else dtype)"})
    layout: str = attrs.field(default="rcr", validator=_layout, metadata={
        "help": f"storage of A, B, C, one letter each (r = row-major, c = column-major): {', '.join(LAYOUTS)}"})
    num_d: int = attrs.field(default=0, converter=as_int, metadata={
        "help": "extra tensors d0..d3 shaped like C, fused into the epilogue (0..4)"})
    d_op: str = attrs.field(default="add", metadata={
        "help": f"how the D tensors combine with the accumulator: {', '.join(D_OPS)}"})
    activation: str = attrs.field(default="none", metadata={
        "help": f"applied to the result last: {', '.join(ACTIVATIONS)}"})
    preshuffle: bool = attrs.field(default=False, metadata={
        "help": "B is pre-shuffled into the kernel's N x K tile order (ck_gemm.preshuffle; layout rcr)"})
    pack_n: int = attrs.field(default=0, converter=as_int, metadata={
        "help": "tile N the pre-shuffled B was packed for (0: any; set by ck_gemm.preshuffle)"})
    pack_k: int = attrs.field(default=0, converter=as_int, metadata={
        "help": "tile K the pre-shuffled B was packed for (0: any; set by ck_gemm.preshuffle)"})

    def __attrs_post_init__(self):
        if not self.dtype_c:
            object.__setattr__(self, "dtype_c", DEFAULT_C[self.dtype])
        check_dtype(self.dtype_c, ("fp16", "bf16", "fp32", "int32"))
        if self.dtype == "int8" and self.dtype_c != "int32":
            raise InvalidProblem("int8 GEMM accumulates and outputs int32; set dtype_c='int32'")
        if not isinstance(self.num_d, int) or isinstance(self.num_d, bool) or not 0 <= self.num_d <= 4:
            raise InvalidProblem(f"GemmProblem.num_d must be 0..4, got {self.num_d!r}")
        if self.d_op not in D_OPS:
            raise InvalidProblem(f"GemmProblem.d_op={self.d_op!r}; use one of {', '.join(D_OPS)}")
        if self.activation not in ACTIVATIONS:
            raise InvalidProblem(f"GemmProblem.activation={self.activation!r}; use one of "
                                 f"{', '.join(ACTIVATIONS)}")
        self._check_preshuffle()

    def _check_preshuffle(self) -> None:
        if type(self.preshuffle) is not bool:
            raise InvalidProblem(f"GemmProblem.preshuffle must be true or false, got {self.preshuffle!r}")
        pn, pk = self.pack_n, self.pack_k
        if not self.preshuffle:
            if pn or pk:
                raise InvalidProblem("GemmProblem.pack_n / pack_k describe a pre-shuffled B; set preshuffle=True "
                                     "or leave them 0")
            return
        if self.layout != "rcr":
            raise InvalidProblem(f"a pre-shuffled B is a linear weight (N x K, K contiguous): layout must be "
                                 f"'rcr', not {self.layout!r}")
        if self.batch != 1:
            raise InvalidProblem(f"a pre-shuffled B is one weight: batch must be 1, not {self.batch}")
        if (pn == 0) != (pk == 0):
            raise InvalidProblem(f"GemmProblem.pack_n={pn}, pack_k={pk}: give both (the tile B was packed for) "
                                 f"or neither (a tile still to be chosen)")
        for name, v in (("pack_n", pn), ("pack_k", pk)):
            if v and (v < 16 or v & (v - 1) or v > 1024):
                raise InvalidProblem(f"GemmProblem.{name}={v}: a kernel tile size, a power of two in [16, 1024]")

    @property
    def packed(self) -> bool:
        """Whether B is pre-shuffled for a known tile (the problem can run)."""
        return self.preshuffle and self.pack_n > 0

    def input_names(self) -> tuple:
        """The tensors this problem reads: A, B and one D per epilogue operand."""
        return ("a", "b") + tuple(f"d{i}" for i in range(self.num_d))

    # -- tensor shapes (storage order) ----------------------------------------
    def _lead(self) -> tuple:
        return (self.batch,) if self.batch > 1 else ()

    def shape_a(self) -> tuple:
        return self._lead() + ((self.m, self.k) if self.layout[0] == "r" else (self.k, self.m))

    def shape_b(self) -> tuple:
        """B's stored shape; pre-shuffled: ``(N tiles, K tiles, pack_n, pack_k)``."""
        if self.preshuffle:
            if not self.pack_n:
                raise InvalidProblem("this pre-shuffled problem has no pack tile (pack_n / pack_k 0): it selects a "
                                     "tile but runs no B; pack B with ck_gemm.preshuffle or ck_gemm.problem.pack_b")
            return (-(-self.n // self.pack_n), -(-self.k // self.pack_k), self.pack_n, self.pack_k)
        return self._lead() + ((self.k, self.n) if self.layout[1] == "r" else (self.n, self.k))

    def shape_c(self) -> tuple:
        return self._lead() + ((self.m, self.n) if self.layout[2] == "r" else (self.n, self.m))

    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    def bytes_moved(self) -> float:
        from ck_core.dtypes import ELEMENT_BYTES as eb

        return self.batch * (eb[self.dtype] * (self.m * self.k + self.k * self.n)
                             + eb[self.dtype_c] * self.m * self.n * (1 + self.num_d))

    def bucket(self) -> tuple:
        """Tuning bucket: dtypes, layout, epilogue and each size rounded up to a power of two."""
        p2 = lambda x: 1 << (int(x) - 1).bit_length()
        out = (self.dtype, self.dtype_c, self.layout, self.num_d, self.d_op, self.activation,
               p2(self.batch), p2(self.m), p2(self.n), p2(self.k))
        # (a pre-shuffled B is a bucket of its own; unshuffled buckets keep their old form)
        return out + ("preshuffle", self.pack_n, self.pack_k) if self.preshuffle else out

    def check_arrays(self, tensors: dict, names=None) -> None:
        """Shape (and, for numpy arrays, dtype) checks; InvalidProblem names the tensor."""
        want = {"a": (self.shape_a(), self.dtype), "b": (self.shape_b(), self.dtype)}
        for i in range(self.num_d):
            want[f"d{i}"] = (self.shape_c(), self.dtype_c)
        for name, (shape, dt) in want.items():
            if name not in tensors:
                raise InvalidProblem(f"GEMM needs tensor {name!r} of shape {shape} ({dt})")
            t = tensors[name]
            got = tuple(t.shape)
            if name == "b" and self.preshuffle and got != shape:
                raise InvalidProblem(f"tensor 'b' has shape {got}; a B pre-shuffled for tile "
                                     f"{self.pack_n}x{self.pack_k} of N={self.n}, K={self.k} is {shape} "
                                     f"(pack it with ck_gemm.problem.pack_b or ck_gemm.preshuffle)")
            if got != shape and not (self.batch == 1 and got == (1,) + shape):
                raise InvalidProblem(f"tensor {name!r} has shape {got}, expected {shape} for "
                                     f"{self.layout} layout (M={self.m}, N={self.n}, K={self.k}, "
                                     f"batch={self.batch})")
            if isinstance(t, np.ndarray) and t.dtype != numpy_storage(dt):
                raise InvalidProblem(f"tensor {name!r} has numpy dtype {t.dtype}, expected "
                                     f"{numpy_storage(dt)} for {dt}; convert it with "
                                     f"ck_core.dtypes.quantize(x, {dt!r})")


def pack_b(b_nk, tile_n: int, tile_k: int):
    """B (N x K, K contiguous: a linear weight) pre-shuffled for a ``tile_n x tile_k`` kernel tile:
    ``[ceil(N/tile_n), ceil(K/tile_k), tile_n, tile_k]``, zero-padded, each tile one contiguous block
    in the order the kernel's K loop reads them.  Takes and returns a numpy array or a torch tensor."""
    n, k = b_nk.shape
    nt, kt = -(-n // tile_n), -(-k // tile_k)
    if isinstance(b_nk, np.ndarray):
        padded = np.zeros((nt * tile_n, kt * tile_k), dtype=b_nk.dtype)
        padded[:n, :k] = b_nk
        return np.ascontiguousarray(padded.reshape(nt, tile_n, kt, tile_k).transpose(0, 2, 1, 3))
    padded = b_nk.new_zeros((nt * tile_n, kt * tile_k))
    padded[:n, :k] = b_nk
    return padded.reshape(nt, tile_n, kt, tile_k).permute(0, 2, 1, 3).contiguous()


def unpack_b(packed, n: int, k: int):
    """The N x K B of a pre-shuffled one (:func:`pack_b`), as a numpy array."""
    packed = np.asarray(packed)
    nt, kt, tn, tk = packed.shape
    return packed.transpose(0, 2, 1, 3).reshape(nt * tn, kt * tk)[:n, :k]
