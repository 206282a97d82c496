"""What a built library holds, for the backends' export and checks: the device-code modules an
executable imports, and the kernels the build left on the host."""

from __future__ import annotations


def host_side_kernels(manifest: dict) -> set[str]:
    """Kernels the build found no thread binding in (they run on the host, with no device code).
    Every other kernel of a GPU artifact must have its device code in the library."""
    return {k["name"] for k in manifest.get("kernels", []) if "launch" in k and not k["launch"]}


def device_modules(executable):
    """The device-code modules imported by an executable's host module (empty for llvm)."""
    return imported_device_modules(executable.mod)


def imported_device_modules(module):
    """The device-code modules a runtime module imports, at any depth (not host code)."""
    found = []

    def walk(mod, depth):
        if depth > 0 and mod.kind not in ("llvm", "c", "static_library"):
            found.append(mod)
        for sub in mod.imports:
            walk(sub, depth + 1)

    walk(module, 0)
    return found
