"""How far a kernel's output may be from its reference: one table, by the dtype it computes in.

`mlcpipe check` compares each output tensor at the tolerance of its dtype; `mlcpipe tune` and the
tests compare whole kernels at their quantization entry's `tolerance` (that of its model dtype).
Relative to the largest |value| of the reference output.
"""

from __future__ import annotations

TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}
