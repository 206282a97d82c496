"""The package list: one import package, `mlcpipe` (no generic top-level names in site-packages):
the repository's pipeline/ is `mlcpipe`, schedules/ is `mlcpipe.schedules`, and configs/ ships
inside it as `mlcpipe.configs` (so an installed mlcpipe finds its model and target YAMLs)."""

from setuptools import find_packages, setup

FOLDERS = {"pipeline": "mlcpipe", "schedules": "mlcpipe.schedules"}  # repository folder -> import name


def _packages() -> list[str]:
    found = []
    for folder, name in FOLDERS.items():
        found += [name + package[len(folder):] for package in find_packages(include=[folder, f"{folder}.*"])]
    return [*found, "mlcpipe.configs"]


setup(
    packages=_packages(),
    package_dir={"mlcpipe": "pipeline", "mlcpipe.schedules": "schedules", "mlcpipe.configs": "configs"},
)
