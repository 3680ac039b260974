"""One conv example = one direction and spatial rank; the six scripts differ only in those."""
import _common as ex

from ck_conv.problem import ConvProblem

# small on the CPU (the float64 reference and the numpy backend are direct loops over taps)
CPU = {2: [dict(N=2, G=2, C=8, K=12, input_spatial=(9, 11), filter=(3, 3), pad_left=(1, 0), pad_right=(1, 2)),
           dict(N=1, G=1, C=16, K=8, input_spatial=(8, 8), filter=(3, 3), stride=(2, 2), pad_left=(1, 1),
                pad_right=(1, 1)),
           dict(N=3, G=4, C=8, K=8, input_spatial=(6, 7), filter=(1, 1))],
       3: [dict(N=1, G=2, C=4, K=6, input_spatial=(5, 6, 7), filter=(3, 3, 3), pad_left=(1, 1, 1),
                pad_right=(1, 1, 1)),
           dict(N=2, G=1, C=8, K=4, input_spatial=(4, 5, 6), filter=(2, 3, 1), stride=(1, 2, 1),
                dilation=(2, 1, 1))]}
GPU = {2: [dict(N=32, G=1, C=64, K=64, input_spatial=(56, 56), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1)),
           dict(N=8, G=2, C=128, K=256, input_spatial=(28, 28), filter=(1, 1))],
       3: [dict(N=4, G=1, C=32, K=64, input_spatial=(16, 28, 28), filter=(3, 3, 3), pad_left=(1, 1, 1),
                pad_right=(1, 1, 1))]}


def main(direction: str, ndim: int, doc: str) -> None:
    args = ex.parse_args(doc)
    disp = ex.dispatcher("conv", args, directions=[direction], ndims=[ndim], dtypes=["fp16"])
    print(f"{len(disp.registry)} {direction} {ndim}-D fp16 kernels")
    ok = True
    for shape in (GPU if args.gpu else CPU)[ndim]:
        p = ConvProblem(direction=direction, dtype="fp16", **shape)
        ok &= ex.check(disp, p, args.rng, label=f"{direction} N={p.N} G={p.G} C={p.C} K={p.K} "
                       f"in={p.input_spatial} filter={p.filter}")
    ex.finish(ok)
