"""Optional text tokenizer (HF `tokenizer.json` through the `tokenizers` package)."""

from __future__ import annotations

from pathlib import Path

from .config import short_text
from .errors import ArtifactError


class Tokenizer:
    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise ArtifactError(f"{path}: reading it needs the `tokenizers` package (pip install 'mlcpipe[tokenizers]')") from None
        self.path = path
        self._tok = self._load(HFTokenizer, path)

    @staticmethod
    def _load(factory, path: Path):
        try:
            return factory.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - `tokenizers` raises plain Exception with serde's message
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ArtifactError(f"{path}: corrupt tokenizer.json (the `tokenizers` package cannot read it: "
                                f"{short_text(reason, 160)})") from None

    @classmethod
    def check(cls, path: Path) -> None:
        """ArtifactError (one line) if `tokenizers` is installed and cannot read `path`."""
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            return
        cls._load(HFTokenizer, Path(path))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def tokenizers_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("tokenizers") is not None


def find_tokenizer(explicit: Path | None, weights: str | None, needed: bool = True) -> Tokenizer | None:
    """--tokenizer if given, else tokenizer.json beside the weights, else None. Not `needed` (the
    prompt is token ids; text would only decorate the output): None rather than an error where
    the `tokenizers` package is missing for the weights' tokenizer.json."""
    if explicit is not None:
        if not Path(explicit).is_file():
            raise ArtifactError(f"--tokenizer {explicit}: file not found")
        return Tokenizer(Path(explicit))
    if weights and weights != "synthetic" and (Path(weights) / "tokenizer.json").is_file():
        if not needed and not tokenizers_installed():
            return None
        return Tokenizer(Path(weights) / "tokenizer.json")
    return None
