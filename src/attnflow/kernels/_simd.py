"""`wide_vectors()`: let LLVM vectorise the calling numba function with 512-bit registers;
`arrays_do_not_overlap()`: tell LLVM that the calling function's array arguments do not
overlap where written (numba cannot say so itself: `@njit` has no such option);
`vector_bytes()`: the width of the vector registers that numba's code uses on this target.

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

from functools import cache

import llvmlite.binding as ll
from llvmlite import ir
from numba import types
from numba.core.registry import cpu_target
from numba.extending import intrinsic

__all__ = ["vector_bytes", "wide_vectors"]

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


# One 512-bit vector add with wide_vectors' attributes: the registers the code generator picks
# for it are the widest of numba's target (its CPU name and features).
_PROBE = """
define void @probe(ptr %p) #0 {
  %v = load <16 x float>, ptr %p
  %w = fadd <16 x float> %v, %v
  store <16 x float> %w, ptr %p
  ret void
}
attributes #0 = { ATTRIBUTES }
""".replace("ATTRIBUTES", " ".join(ATTRIBUTES))


@cache
def vector_bytes() -> int:
    """Bytes of the widest vector registers in numba's compiled code for this process's
    target: 64 with AVX-512, 32 with AVX2, 16 with SSE2 or NEON. Read from the code LLVM
    emits for numba's own target machine (the host CPU, or NUMBA_CPU_NAME and
    NUMBA_CPU_FEATURES), so it never names registers that the target lacks."""
    module = ll.parse_assembly(_PROBE)
    asm = cpu_target.target_context.codegen()._tm.emit_assembly(module)
    for register, size in (("zmm", 64), ("ymm", 32)):
        if f"%{register}" in asm:
            return size
    return 16


@intrinsic
def arrays_do_not_overlap(typingctx):
    """Call once at the top of an njit function whose array arguments' data never overlap
    where any of them is written (arrays only read may be the same): marks each array
    argument's data pointer noalias (numba passes an array as its members; the data pointer
    is the fifth, named arg.<name>.4), so that LLVM may keep values loaded from one array in
    registers while it stores to another. No arguments, returns None; emits no code."""

    def codegen(context, builder, signature, args):
        for arg in builder.function.args:
            if arg.name.startswith("arg.") and arg.name.endswith(".4") \
                    and isinstance(arg.type, ir.PointerType):
                arg.add_attribute("noalias")
        return context.get_dummy_value()

    return types.none(), codegen
