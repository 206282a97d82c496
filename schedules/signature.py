"""A kernel's signature: what a tuning record is keyed by.

Two PrimFuncs with the same computation, shapes and dtypes get the same signature whatever their
names (the same GEMV in another model, or rebuilt tomorrow); any change in the computation gives
another. It is the SHA-256 of the unscheduled function's TVMScript with parameter and buffer names
replaced by their position.
"""

from __future__ import annotations

import hashlib
import re

from tvm import tirx


def kernel_signature(func: tirx.PrimFunc) -> str:
    text = func.script(show_meta=False)
    names = [p.name for p in func.params if hasattr(p, "name")]
    for index, name in enumerate(names):
        text = re.sub(rf"\b{re.escape(name)}\b", f"arg{index}", text)
    text = re.sub(r"^def \w+\(", "def kernel(", text, flags=re.M)
    return hashlib.sha256(text.encode()).hexdigest()[:24]
