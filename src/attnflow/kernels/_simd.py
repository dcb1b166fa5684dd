"""`wide_vectors()`: let LLVM vectorise the calling numba function with 512-bit registers.

LLVM tunes AVX-512 CPUs to prefer 256-bit vectors (the "prefer-256-bit" tuning, from the
clock throttling of early AVX-512 parts), so numba's auto-vectorised loops use half of the
registers' width. On this project's machines (benchmarks/RESULTS.md) the fused kernel runs
1.5 times faster with 512-bit vectors. The process-wide switch (NUMBA_CPU_FEATURES with
"-prefer-256-bit") would change every numba function of the process; this intrinsic instead
sets the two LLVM function attributes on the one function that calls it:

    "prefer-vector-width"="512"      the width the loop and SLP vectorisers aim for,
    "min-legal-vector-width"="512"   so the code generator keeps 512-bit types whole.

On CPUs without AVX-512 the attributes ask for nothing that exists, and the vectorisers use
the widest registers there are. It emits no code.
"""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic

__all__ = ["wide_vectors"]

ATTRIBUTES = ('"prefer-vector-width"="512"', '"min-legal-vector-width"="512"')


@intrinsic
def wide_vectors(typingctx):
    """Call once at the top of an njit function (no arguments, returns None)."""

    def codegen(context, builder, signature, args):
        for attribute in ATTRIBUTES:
            # llvmlite validates only the keyword attributes it knows; string attributes
            # ("key"="value") are written into the IR as given, so add them to the set as is.
            set.add(builder.function.attributes, attribute)
        return context.get_dummy_value()

    return types.none(), codegen
