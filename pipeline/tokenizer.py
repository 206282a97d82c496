"""Optional text tokenizer (HF `tokenizer.json` through the `tokenizers` package)."""

from __future__ import annotations

from pathlib import Path

from .errors import ArtifactError


class Tokenizer:
    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise ArtifactError(f"{path}: reading it needs the `tokenizers` package (pip install 'mlcpipe[tokenizers]')") from None
        self.path = path
        self._tok = HFTokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def find_tokenizer(explicit: Path | None, weights: str | None) -> Tokenizer | None:
    """--tokenizer if given, else tokenizer.json beside the weights, else None."""
    if explicit is not None:
        if not Path(explicit).is_file():
            raise ArtifactError(f"--tokenizer {explicit}: file not found")
        return Tokenizer(Path(explicit))
    if weights and weights != "synthetic" and (Path(weights) / "tokenizer.json").is_file():
        return Tokenizer(Path(weights) / "tokenizer.json")
    return None
