"""pipeline/artifact.py: the file primitives every writer and reader goes through (ownership,
atomic directories and files, confined paths, digests, the manifest's fields), on small trees."""

from __future__ import annotations

import json
import os
import stat

import pytest

from mlcpipe.artifact import (
    MANIFEST,
    RUN_FIELDS,
    atomic_directory,
    check_distinct_paths,
    check_not_inside,
    check_writable,
    confined,
    file_digests,
    owner_kind,
    read_json,
    read_manifest,
    verified,
    write_file_atomic,
)
from mlcpipe.errors import ArtifactError


def _artifact(path, files: dict[str, bytes], **manifest) -> dict:
    path.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    record = {"format": "mlcpipe-artifact/1", "model": "m", "quantization": "q4f32_1", "target": {"kind": "llvm"},
              "library": "lib.so", "parameters": [], "kernels": [], "files": file_digests(path), **manifest}
    (path / MANIFEST).write_text(json.dumps(record))
    return record


def test_atomic_directory_replaces_whole_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    with atomic_directory(out, kind="artifact") as tmp:
        _artifact(tmp, {"lib.so": b"one"})
    assert owner_kind(out) == "artifact" and (out / "lib.so").read_bytes() == b"one"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_directory(out, kind="artifact") as tmp:
            _artifact(tmp, {"lib.so": b"two"})
            raise RuntimeError("boom")
    assert (out / "lib.so").read_bytes() == b"one"  # the failed write left the old artifact whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # and no temp dir or lock beside it
    with atomic_directory(out, kind="artifact") as tmp:
        _artifact(tmp, {"lib.so": b"two"})
    assert (out / "lib.so").read_bytes() == b"two"


def test_check_writable_refuses_what_mlcpipe_did_not_create(tmp_path):
    check_writable(tmp_path / "new", "artifact")
    (tmp_path / "empty").mkdir()
    check_writable(tmp_path / "empty", "artifact")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match=r"refusing to write .*theirs: it holds files mlcpipe did not create \(e\.g\. notes\.txt\)"):
        check_writable(tmp_path / "theirs", "artifact")
    _artifact(tmp_path / "art", {"lib.so": b"x"})
    check_writable(tmp_path / "art", "artifact")
    with pytest.raises(ArtifactError, match="it is an mlcpipe artifact, not an mlcpipe weights directory"):
        check_writable(tmp_path / "art", "weights")
    (tmp_path / "art" / "extra.bin").write_bytes(b"?")  # a foreign file inside an artifact
    with pytest.raises(ArtifactError, match=r"holds files mlcpipe did not create \(e\.g\. extra\.bin\)"):
        check_writable(tmp_path / "art", "artifact")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArtifactError, match="it is a file, not a directory mlcpipe created"):
        check_writable(tmp_path / "file", "artifact")


def test_outputs_never_inside_or_equal_to_inputs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for out, why in ((src, "is the --weights directory"), (src / "x", "lies inside the --weights directory"),
                     (tmp_path, "contains the --weights directory")):
        with pytest.raises(ArtifactError, match=why):
            check_not_inside(out, src, "--output", "--weights")
    check_not_inside(tmp_path / "elsewhere", src)
    (src / "a.json").write_text("{}")
    with pytest.raises(ValueError, match=r"^-o .*a\.json: is the input --in .*a\.json; write the output elsewhere$"):
        check_distinct_paths({"--in": src / "a.json"}, {"-o": src / "a.json"})
    with pytest.raises(ValueError, match="is also -o's output"):
        check_distinct_paths({}, {"-o": tmp_path / "r.md", "--save-json": tmp_path / "r.md"})
    with pytest.raises(ValueError, match="is inside the input --artifact"):
        check_distinct_paths({}, {"-o": src / "logits.npy"}, {"--artifact": src})


def test_write_file_atomic_keeps_the_old_file_on_failure(tmp_path):
    path = write_file_atomic(tmp_path / "f.txt", "one")
    assert path.read_text() == "one" and oct(path.stat().st_mode & 0o777) == "0o644"
    path.chmod(0o600)
    write_file_atomic(path, b"two")
    assert path.read_text() == "two" and oct(path.stat().st_mode & 0o777) == "0o600"  # the user's permissions kept
    (tmp_path / "dir").mkdir()  # the rename over it fails (even for root): the error names it, nothing changes
    (tmp_path / "dir" / "kept").write_text("keep")
    with pytest.raises(ArtifactError, match=r"dir: could not write it: Is a directory \(nothing was changed\)"):
        write_file_atomic(tmp_path / "dir", "new")
    assert (tmp_path / "dir" / "kept").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "f.txt"]  # no temp file left


def test_write_file_atomic_writes_a_pipe_in_place_and_follows_symlinks(tmp_path):
    """`-o /dev/stdout`, `-o /dev/full`: a device or a pipe is written, not renamed over (as root
    the rename replaced the node itself with a file). A symlink keeps pointing at the new file."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open first: the writer's open does not block
    try:
        write_file_atomic(fifo, "report\n")
        try:
            got = os.read(reader, 1 << 16)
        except BlockingIOError:  # nothing was written into the pipe
            got = b""
    finally:
        os.close(reader)
    assert got == b"report\n" and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]

    real = write_file_atomic(tmp_path / "real.md", "old")
    (tmp_path / "link.md").symlink_to(real)
    write_file_atomic(tmp_path / "link.md", "new")
    assert (tmp_path / "link.md").is_symlink() and real.read_text() == "new"
    check_distinct_paths({}, {"-o": fifo})  # a pipe's directory need not be writable: it is not touched


def test_confined_paths_stay_inside(tmp_path):
    (tmp_path / "a").mkdir()
    assert confined(tmp_path, "a/b.bin", "here") == tmp_path / "a" / "b.bin"
    for bad, why in (("../x", "must stay inside"), ("/etc/passwd", "must stay inside"), ("", "expected a file name"),
                     (3, "expected a file name")):
        with pytest.raises(ArtifactError, match=why):
            confined(tmp_path, bad, "here")
    (tmp_path / "link").symlink_to("/")
    with pytest.raises(ArtifactError, match=r"resolves to .*, outside .* \(symlink\)"):
        confined(tmp_path, "link/etc", "here")


def test_manifest_fields_and_digests_are_checked_before_use(tmp_path):
    art = tmp_path / "art"
    manifest = _artifact(art, {"lib.so": b"library", "tir/k.json": b"{}"})
    assert read_manifest(art, RUN_FIELDS)["model"] == "m"
    assert verified(art, manifest, "tir/k.json", "tir").read_bytes() == b"{}"
    (art / "tir" / "k.json").write_bytes(b"[]")  # same size, other bytes
    with pytest.raises(ArtifactError, match=r"k\.json: sha256 .* does not match .* recorded in .*manifest\.json"):
        verified(art, manifest, "tir/k.json", "tir")
    with pytest.raises(ArtifactError, match="has no SHA-256 in field 'files'"):
        verified(art, manifest, "other.bin", "x")
    bad = {**manifest, "target": {"kind": "rocm"}}
    (art / MANIFEST).write_text(json.dumps(bad))
    with pytest.raises(ArtifactError, match=r"field 'target': got .*rocm.*; expected a TVM target object whose kind is llvm, cuda, metal or webgpu"):
        read_manifest(art, RUN_FIELDS)
    (art / MANIFEST).write_text("{not json")
    with pytest.raises(ArtifactError, match=r"corrupt manifest: .*\(line 1, column 2\)"):
        read_json(art / MANIFEST, "manifest")
    with pytest.raises(ArtifactError, match=r"not an mlcpipe artifact \(manifest\.json missing\)"):
        read_manifest(tmp_path)
