"""What a grouped convolution caller wants computed: :class:`ConvProblem`.

Conventions
-----------
* ``C`` and ``K`` are **totals** over all groups (PyTorch's ``in_channels`` /
  ``out_channels``), each divisible by ``G``.  CK's own ``ConvParam`` stores the
  per-group counts; :attr:`ConvProblem.c_per_group` / :attr:`k_per_group` give
  those, and :meth:`ConvProblem.from_ck` takes CK's convention.
* Spatial sizes, filter sizes, strides, dilations and paddings are tuples with
  one entry per spatial dimension, outermost first (D, H, W / Z, Y, X).
* A layout string names the tensor's array dimensions in order, one letter per
  dimension, as CK spells them: ``NHWGC`` is an array of shape
  ``(N, H, W, G, C/G)``; ``GKYXC`` is ``(G, K/G, Y, X, C/G)``.
* ``direction`` says which tensor is computed: ``forward`` -> output,
  ``bwd_data`` -> input gradient, ``bwd_weight`` -> weight gradient.
"""
from __future__ import annotations

import numbers
from typing import Any, ClassVar

import attrs

from ck_core.errors import InvalidProblem
from ck_core.problem import Problem, as_int

DIRECTIONS = ("forward", "bwd_data", "bwd_weight")
#: the tensors each direction reads (by name: x input, w weight, dy output gradient)
IN_NAMES = {"forward": ("x", "w"), "bwd_data": ("dy", "w"), "bwd_weight": ("x", "dy")}
OUT_NAME = {"forward": "y", "bwd_data": "dx", "bwd_weight": "dw"}
DTYPES = ("fp16", "bf16", "fp32")

# letters of the spatial dimensions of image tensors and of filters, per ndim
_IMG = {1: "W", 2: "HW", 3: "DHW"}
_FLT = {1: "X", 2: "YX", 3: "ZYX"}

#: layout families; each maps ndim -> (input, weight, output) layout names
LAYOUT_FAMILIES = {
    # channels last, group before channel (CK's preferred, our Triton kernels')
    "nhwgc": {n: ("N" + _IMG[n] + "GC", "GK" + _FLT[n] + "C", "N" + _IMG[n] + "GK") for n in (1, 2, 3)},
    # channels first (PyTorch's default NCHW with groups split out)
    "ngchw": {n: ("NGC" + _IMG[n], "GKC" + _FLT[n], "NGK" + _IMG[n]) for n in (1, 2, 3)},
    # group outermost
    "gnhwc": {n: ("GN" + _IMG[n] + "C", "GK" + _FLT[n] + "C", "GN" + _IMG[n] + "K") for n in (1, 2, 3)},
}
IN_LAYOUTS = {f[n][0]: n for f in LAYOUT_FAMILIES.values() for n in (1, 2, 3)}
WEI_LAYOUTS = {f[n][1]: n for f in LAYOUT_FAMILIES.values() for n in (1, 2, 3)}
OUT_LAYOUTS = {f[n][2]: n for f in LAYOUT_FAMILIES.values() for n in (1, 2, 3)}


def _tuple(v) -> tuple:
    """A size or a sequence of sizes as a tuple, values untouched (validators refuse 2.7 or True,
    where ``int()`` would silently truncate them)."""
    if isinstance(v, (numbers.Number, str)) or v is None:
        return (as_int(v),)
    try:
        return tuple(as_int(x) for x in v)
    except TypeError:
        raise InvalidProblem(f"expected a size or a sequence of sizes, got {v!r}") from None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: input layout -> its family (the first family that names it)
_FAMILY_OF: dict = {}
for _fam, _per in LAYOUT_FAMILIES.items():
    for _n in _per:
        _FAMILY_OF.setdefault(_per[_n][0], _fam)


def family_of(in_layout: str) -> str:
    fam = _FAMILY_OF.get(in_layout) if isinstance(in_layout, str) else None
    if fam is not None:
        return fam
    raise InvalidProblem(f"unknown input layout {in_layout!r}; use one of {', '.join(sorted(IN_LAYOUTS))}")


def _positive(name):
    def check(inst, attr, value):
        if isinstance(value, tuple):
            if not value or any(not _is_int(x) or x <= 0 for x in value):
                raise InvalidProblem(f"{name} must be positive integers, got {value!r}; "
                                     f"give one positive size per spatial dimension")
        elif not _is_int(value) or value <= 0:
            raise InvalidProblem(f"{name} must be a positive integer, got {value!r}")
    return check


def _non_negative(name):
    def check(inst, attr, value):
        if any(not _is_int(x) or x < 0 for x in value):
            raise InvalidProblem(f"{name} must be integers >= 0, got {value!r}")
    return check


def _one_of(name, allowed):
    def check(inst, attr, value):
        if value not in allowed:
            raise InvalidProblem(f"unknown {name} {value!r}; use one of {', '.join(allowed)}")
    return check


_OUT_SPATIAL: dict = {}
_GEMM_MNK: dict = {}
_SPECIALIZATION: dict = {}


@attrs.frozen(kw_only=True, cache_hash=True)   # selection keys many caches by the problem
class ConvProblem(Problem):
    """A grouped 1D/2D/3D convolution, forward or backward, CK-style.

    >>> p = ConvProblem(N=2, G=2, C=8, K=4, input_spatial=(9, 9), filter=(3, 3),
    ...                 stride=(2, 2), pad_left=(1, 1), pad_right=(1, 1))
    >>> p.output_spatial, p.in_layout, p.gemm_mnk
    ((5, 5), 'NHWGC', (50, 2, 36))

    Fields
    ------
    N, G          batch; groups (C and K divisible by G)
    C, K          input and output channels, totals over all groups
    input_spatial  one size per spatial dimension, outermost first (D,H,W), e.g. 9,11
    filter        filter sizes per spatial dimension, e.g. 3,3
    stride        per dimension (default 1s)
    dilation      per dimension (default 1s)
    pad_left      per dimension, before the data (default 0s)
    pad_right     per dimension, after the data (default 0s)
    direction     forward (output), bwd_data (input gradient), bwd_weight (weight gradient)
    dtype         fp16, bf16, fp32
    in_layout     input layout as CK spells it ('' = NHWGC family), e.g. NHWGC, NGCHW
    wei_layout    weight layout ('' = the input's family)
    out_layout    output layout ('' = the input's family)
    split_k       the kernel's reduction split (forward / bwd_data: channel x tap steps;
                  bwd_weight: N and pixels): 0 (default) = any split, selection chooses;
                  1 = unsplit kernels only, n = kernels splitting n ways
    """

    op: ClassVar[str] = "conv"

    N: int = attrs.field(converter=as_int, validator=_positive("N"), metadata={
        "help": "batch size: images per call"})
    G: int = attrs.field(default=1, converter=as_int, validator=_positive("G"), metadata={
        "help": "groups (C and K divisible by G; depthwise: G = C = K)"})
    C: int = attrs.field(converter=as_int, validator=_positive("C"), metadata={
        "help": "input channels, the total over all groups"})
    K: int = attrs.field(converter=as_int, validator=_positive("K"), metadata={
        "help": "output channels (filters), the total over all groups"})
    input_spatial: tuple = attrs.field(converter=_tuple, validator=_positive("input_spatial"), metadata={
        "help": "input size per spatial dimension, outermost first (D,H,W), e.g. 9,11: its length makes it 1D/2D/3D"})
    filter: tuple = attrs.field(converter=_tuple, validator=_positive("filter"), metadata={
        "help": "filter size per spatial dimension, e.g. 3,3"})
    stride: tuple = attrs.field(default=(), converter=_tuple, metadata={
        "help": "stride per spatial dimension (default 1 each)"})
    dilation: tuple = attrs.field(default=(), converter=_tuple, metadata={
        "help": "filter dilation per spatial dimension (default 1 each)"})
    pad_left: tuple = attrs.field(default=(), converter=_tuple, metadata={
        "help": "zero padding before the data, per spatial dimension (default 0 each)"})
    pad_right: tuple = attrs.field(default=(), converter=_tuple, metadata={
        "help": "zero padding after the data, per spatial dimension (default 0 each)"})
    direction: str = attrs.field(default="forward", validator=_one_of("direction", DIRECTIONS), metadata={
        "help": "what to compute: forward (output y), bwd_data (input gradient dx), bwd_weight (weight gradient dw)"})
    dtype: str = attrs.field(default="fp16", validator=_one_of("dtype", DTYPES), metadata={
        "help": f"element dtype: {', '.join(DTYPES)}"})
    in_layout: str = attrs.field(default="", metadata={
        "help": "input layout as CK spells it, e.g. NHWGC, NGCHW, GNHWC ('' = the NHWGC family)"})
    wei_layout: str = attrs.field(default="", metadata={
        "help": "weight layout, e.g. GKYXC ('' = the input layout's family)"})
    out_layout: str = attrs.field(default="", metadata={
        "help": "output layout, e.g. NHWGK ('' = the input layout's family)"})
    #: bwd_weight only: how many programs split the pixel reduction; 0 lets the launcher choose
    split_k: int = attrs.field(default=0, converter=as_int, metadata={
        "help": "the kernels' reduction split: 0 = any (selection chooses), 1 = unsplit kernels only, n = kernels "
                "splitting n ways"})

    def __attrs_post_init__(self):
        nd = len(self.input_spatial)
        if nd not in (1, 2, 3):
            raise InvalidProblem(f"input_spatial has {nd} dimensions; give 1, 2 or 3 sizes (W / H, W / D, H, W)")
        if len(self.filter) != nd:
            raise InvalidProblem(f"filter {self.filter} has {len(self.filter)} sizes but the input has {nd} "
                                 f"spatial dimensions; give one filter size per spatial dimension")
        # per-dimension defaults: stride/dilation 1, padding 0; a single value broadcasts
        for name, dflt in (("stride", 1), ("dilation", 1), ("pad_left", 0), ("pad_right", 0)):
            v = getattr(self, name)
            if not v:
                v = (dflt,) * nd
            elif len(v) == 1 and nd > 1:
                v = v * nd
            if len(v) != nd:
                raise InvalidProblem(f"{name} {v} has {len(v)} entries; give {nd} (one per spatial dimension)")
            object.__setattr__(self, name, v)
        _positive("stride")(self, None, self.stride)
        _positive("dilation")(self, None, self.dilation)
        _non_negative("pad_left")(self, None, self.pad_left)
        _non_negative("pad_right")(self, None, self.pad_right)
        if self.C % self.G:
            raise InvalidProblem(f"C={self.C} is not divisible by G={self.G}; C is the total input channel "
                                 f"count over all groups (use C = G * channels_per_group)")
        if self.K % self.G:
            raise InvalidProblem(f"K={self.K} is not divisible by G={self.G}; K is the total output channel "
                                 f"count over all groups (use K = G * filters_per_group)")
        fam = None
        if not self.in_layout:
            fam = "nhwgc"
        else:
            fam = family_of(self.in_layout) if self.in_layout in IN_LAYOUTS else None
            if fam is None:
                raise InvalidProblem(f"unknown input layout {self.in_layout!r}; use one of "
                                     f"{', '.join(sorted(IN_LAYOUTS))}")
        dflt = LAYOUT_FAMILIES[fam][nd]
        for i, (name, table) in enumerate((("in_layout", IN_LAYOUTS), ("wei_layout", WEI_LAYOUTS),
                                           ("out_layout", OUT_LAYOUTS))):
            v = getattr(self, name) or dflt[i]
            if v not in table:
                raise InvalidProblem(f"unknown {name} {v!r}; use one of {', '.join(sorted(table))}")
            if table[v] != nd:
                raise InvalidProblem(f"{name} {v!r} is for {table[v]}D but the problem is {nd}D; "
                                     f"use {dflt[i]!r}")
            object.__setattr__(self, name, v)
        if self.out_layout != dflt[2]:
            raise InvalidProblem(f"out_layout {self.out_layout!r} does not match in_layout {self.in_layout!r}; "
                                 f"use {dflt[2]!r}")
        if not _is_int(self.split_k) or self.split_k < 0:
            raise InvalidProblem(f"split_k must be an integer >= 0 (0 = any split: selection chooses), "
                                 f"got {self.split_k!r}")
        for d in range(nd):
            eff = self.dilation[d] * (self.filter[d] - 1) + 1
            padded = self.input_spatial[d] + self.pad_left[d] + self.pad_right[d]
            if padded < eff:
                raise InvalidProblem(
                    f"output size along spatial dim {d} is <= 0: padded input {padded} is smaller than the "
                    f"dilated filter {eff}; enlarge the input or padding, or shrink the filter/dilation")

    def input_names(self) -> tuple:
        """The tensors this problem reads (its direction decides)."""
        return IN_NAMES[self.direction]

    # ---- derived sizes -------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.input_spatial)

    @property
    def c_per_group(self) -> int:
        return self.C // self.G

    @property
    def k_per_group(self) -> int:
        return self.K // self.G

    @property
    def output_spatial(self) -> tuple:
        # selection asks for it thousands of times per problem (the hash is cached)
        got = _OUT_SPATIAL.get(self)
        if got is None:
            if len(_OUT_SPATIAL) > 65536:
                _OUT_SPATIAL.clear()
            got = _OUT_SPATIAL[self] = self._output_spatial()
        return got

    def _output_spatial(self) -> tuple:
        return tuple((i + pl + pr - d * (f - 1) - 1) // s + 1
                     for i, f, s, d, pl, pr in zip(self.input_spatial, self.filter, self.stride,
                                                   self.dilation, self.pad_left, self.pad_right))

    @property
    def layout_family(self) -> str:
        return family_of(self.in_layout)

    @property
    def taps(self) -> int:
        t = 1
        for f in self.filter:
            t *= f
        return t

    @property
    def gemm_mnk(self) -> tuple:
        """The implicit GEMM's (M, N, K) per group for this direction (CK's mapping)."""
        got = _GEMM_MNK.get(self)   # selection asks for it dozens of times per problem
        if got is None:
            if len(_GEMM_MNK) > 65536:
                _GEMM_MNK.clear()
            got = _GEMM_MNK[self] = self._gemm_mnk()
        return got

    def _gemm_mnk(self) -> tuple:
        pix_out = self.N * _prod(self.output_spatial)
        pix_in = self.N * _prod(self.input_spatial)
        if self.direction == "forward":
            return (pix_out, self.k_per_group, self.taps * self.c_per_group)
        if self.direction == "bwd_data":
            return (pix_in, self.c_per_group, self.taps * self.k_per_group)
        return (self.k_per_group, self.taps * self.c_per_group, pix_out)

    @property
    def flops(self) -> int:
        m, n, k = self.gemm_mnk
        return 2 * m * n * k * self.G

    @property
    def specialization(self) -> str:
        """The most specific CK conv specialisation this problem satisfies."""
        got = _SPECIALIZATION.get(self)
        if got is None:
            if len(_SPECIALIZATION) > 65536:
                _SPECIALIZATION.clear()
            got = _SPECIALIZATION[self] = self._specialization()
        return got

    def _specialization(self) -> str:
        zero_pad = not any(self.pad_left) and not any(self.pad_right)
        if all(f == 1 for f in self.filter) and zero_pad:
            if all(s == 1 for s in self.stride):
                return "filter1x1_stride1_pad0"
            return "filter1x1_pad0"
        if all(f == 3 for f in self.filter):
            return "filter3x3"
        return "default"

    # ---- tensor shapes in this problem's layouts -------------------------
    def _dims(self, layout: str, spatial: tuple, chan: int, is_weight: bool = False) -> tuple:
        sizes = {"N": self.N, "G": self.G}
        letters = _FLT[self.ndim] if is_weight else _IMG[self.ndim]
        sizes.update(dict(zip(letters, spatial)))
        if is_weight:
            sizes["K"] = self.k_per_group
            sizes["C"] = self.c_per_group
        else:
            sizes["C" if "C" in layout else "K"] = chan
        return tuple(sizes[ch] for ch in layout)

    @property
    def input_shape(self) -> tuple:
        return self._dims(self.in_layout, self.input_spatial, self.c_per_group)

    @property
    def weight_shape(self) -> tuple:
        return self._dims(self.wei_layout, self.filter, 0, is_weight=True)

    @property
    def output_shape(self) -> tuple:
        return self._dims(self.out_layout, self.output_spatial, self.k_per_group)

    def check_shapes(self, x=None, w=None, y=None) -> None:
        """Raise InvalidProblem when a given tensor's shape disagrees with the problem."""
        for name, t, want, lay in (("input", x, self.input_shape, self.in_layout),
                                   ("weight", w, self.weight_shape, self.wei_layout),
                                   ("output", y, self.output_shape, self.out_layout)):
            if t is not None and tuple(t.shape) != want:
                raise InvalidProblem(f"{name} tensor has shape {tuple(t.shape)} but the problem needs {want} "
                                     f"({lay}); reshape it, or describe the problem from its sizes")

    # ---- (de)serialisation ----------------------------------------------
    def to_dict(self) -> dict:
        # what attrs.asdict gives (tuples as lists), without its recursion: the tuning store
        # asks for it per new problem
        d = {}
        for name in _FIELD_NAMES:
            v = getattr(self, name)
            d[name] = list(v) if isinstance(v, tuple) else v
        d["op"] = "conv"
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ConvProblem":
        d = dict(d)
        d.pop("op", None)
        names = {a.name for a in attrs.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise InvalidProblem(f"unknown ConvProblem fields {sorted(unknown)}; known: {sorted(names)}")
        try:
            return cls(**d)
        except TypeError as exc:  # a required field is missing
            raise InvalidProblem(f"cannot build ConvProblem: {exc}") from None

    @classmethod
    def from_ck(cls, *, G: int, N: int, K: int, C: int, **kw) -> "ConvProblem":
        """Build from CK's ConvParam convention (K and C per group)."""
        return cls(G=G, N=N, K=K * G, C=C * G, **kw)

    def with_direction(self, direction: str, split_k: int = 0) -> "ConvProblem":
        return attrs.evolve(self, direction=direction, split_k=split_k)


_FIELD_NAMES = tuple(a.name for a in attrs.fields(ConvProblem))


def _prod(t) -> int:
    r = 1
    for x in t:
        r *= x
    return r
