"""The package list: pipeline/ and schedules/, and the repository's configs/ folder shipped inside
the package as `pipeline.configs` (so an installed mlcpipe finds its model and target YAMLs)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["pipeline", "pipeline.*", "schedules", "schedules.*"]), "pipeline.configs"],
    package_dir={"pipeline.configs": "configs"},
)
