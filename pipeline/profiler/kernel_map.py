"""Which kernel of one artifact does the work of a kernel of another artifact of the same model.

Used to time an llvm call sequence on a GPU artifact over RPC. A kernel maps to the candidate
with the same role and argument signature found first by: the same name, the name without TVM's
`_cpu` tag, the same slot of the KV cache's constructor, else the only such kernel. Anything else
is a KernelMapError (one line). Details: docs/profiler.md.
"""

from __future__ import annotations

import re


class KernelMapError(ValueError):
    pass


def _signature(kernel: dict) -> tuple:
    return tuple((str(a.get("dtype")), tuple(str(d) for d in a["shape"]) if a.get("shape") is not None else None) for a in kernel.get("args", []))


def _kv_slots(manifest: dict) -> dict[tuple[int, int], str]:
    """(slot, position in the slot's list or -1) -> kernel name."""
    slots: dict[tuple[int, int], str] = {}
    for i, slot in enumerate(manifest.get("kv_cache_kernels") or []):
        if isinstance(slot, str):
            slots[(i, -1)] = slot
        elif isinstance(slot, list):
            for j, name in enumerate(slot):
                if isinstance(name, str):
                    slots[(i, j)] = name
    return slots


def map_kernels(names: list[str], source: dict, dest: dict) -> dict[str, str]:
    """{name in `source`'s manifest: the kernel of `dest`'s manifest doing its work}, for `names`."""
    src = {k["name"]: k for k in source["kernels"]}
    dst = {k["name"]: k for k in dest["kernels"]}
    src_slot = {name: key for key, name in _kv_slots(source).items()}
    dst_by_slot = _kv_slots(dest)
    where = f"{dest['model']} {dest['quantization']} {dest['target']['kind']}"
    mapping: dict[str, str] = {}
    for name in names:
        if name not in src:
            raise KernelMapError(f"kernel {name} is not in the {source['target']['kind']} artifact's manifest")
        role, signature = src[name].get("role", "other"), _signature(src[name])
        candidates = [name, re.sub(r"_cpu(?=_|$)", "", name)]
        if name in src_slot and src_slot[name] in dst_by_slot:
            candidates.append(dst_by_slot[src_slot[name]])
        match = next((c for c in candidates if c in dst and dst[c].get("role", "other") == role and _signature(dst[c]) == signature), None)
        if match is None:
            same = [k for k, v in dst.items() if v.get("role", "other") == role and _signature(v) == signature]
            if len(same) != 1:
                found = "none" if not same else "several: " + ", ".join(sorted(same))
                raise KernelMapError(
                    f"cannot map {source['target']['kind']} kernel {name} (role {role}) to a kernel of {where}: "
                    f"no kernel of that name, and {found} with its role and argument signature"
                )
            match = same[0]
        mapping[name] = match
    return mapping
