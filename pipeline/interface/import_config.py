"""`mlcpipe import-config`: a Hugging Face checkpoint's config.json (and generation_config.json)
as an mlcpipe model YAML, checked by the same parser `build` uses, written to a temp file and
renamed into place; an existing file is never replaced."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml


def import_config(source: Path, output: Path, name: str | None = None) -> Path:
    from ..artifact import read_json
    from ..config import check_path_name, parse_model_config
    from ..errors import ArtifactError
    from ..hf_config import model_yaml

    config_path = Path(source) / "config.json"
    if not config_path.is_file():
        raise ArtifactError(f"{source}: config.json missing (expected a Hugging Face checkpoint directory)")
    output = Path(output)
    if os.path.lexists(output):
        raise ArtifactError(f"refusing to write {output}: it exists; choose a new file name")
    if not (output.parent if str(output.parent) else Path(".")).is_dir():
        raise ArtifactError(f"-o {output}: directory {output.parent} does not exist")
    name = output.stem if name is None else name
    check_path_name(str(output), "name", name)
    generation_path = Path(source) / "generation_config.json"
    generation = read_json(generation_path, "generation config") if generation_path.is_file() else None
    raw = model_yaml(read_json(config_path, "Hugging Face config"), str(config_path), name,
                     generation if isinstance(generation, dict) else None)
    parse_model_config(raw, f"{config_path} (imported)")  # what build will read back, refused here first
    text = f"# Imported by `mlcpipe import-config` from {Path(source).resolve() / 'config.json'}\n" + yaml.safe_dump(raw, sort_keys=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent if str(output.parent) else ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.link(tmp, output)  # fails rather than replace a file made meanwhile
    finally:
        Path(tmp).unlink(missing_ok=True)
    return output
