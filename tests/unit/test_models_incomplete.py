"""``gaudi-gui models``' evidence that a cached revision is incomplete, read from a Hub cache laid out as
huggingface_hub writes it (blobs, snapshot links, refs, its tree cache), with no download record of
ours: what a download by another tool, cut short, leaves. No network."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gaudi_gui.core import hub

COMMIT = "c" * 40


def _revision(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """A cached revision holding ``files`` (each a blob named by its sha256, linked from the snapshot)."""
    repo = cache / hub.repo_folder(repo_id)
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (name.count("/") + 2)) / "blobs" / blob.name)
    return repo


def _incomplete(cache: Path) -> dict[str, str]:
    listing = hub.list_cache(str(cache))
    assert not listing.warnings, listing.warnings
    return {m.repo_id: m.revisions[0].incomplete for m in listing.models}


def test_each_kind_of_evidence_marks_its_revision_and_a_whole_one_stays_unmarked(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    weights = b"w" * 1000
    _revision(cache, "org/whole", {"config.json": b"{}", "model.safetensors": weights})
    _revision(cache, "org/noweights", {"config.json": b"{}", "tokenizer.json": b"{}"})
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    _revision(cache, "org/shard", {"config.json": b"{}", "model-00001-of-00002.safetensors": weights,
                                   "model.safetensors.index.json": json.dumps(index).encode()})
    # Cut short by another tool: the weights' partial blob is there, the tree names the file.
    repo = _revision(cache, "org/cut", {"config.json": b"{}", "pytorch_model.bin": b"old weights",
                                        "sub/model.safetensors": weights})
    sha = hashlib.sha256(b"big weights").hexdigest()
    (repo / "blobs" / f"{sha}.incomplete").write_bytes(b"big")
    (repo / "trees").mkdir()
    (repo / "trees" / f"{COMMIT}.json").write_text(json.dumps({"format_version": 1, "files": {
        "config.json": {"size": 2, "blob_id": "a" * 40},
        "model-big.safetensors": {"size": 11, "blob_id": "b" * 40, "lfs_sha256": sha}}}))
    found = _incomplete(cache)
    assert found["org/whole"] == ""
    assert found["org/noweights"] == "config.json but no weight file: the weights were not downloaded"
    assert found["org/shard"] == ("model-00002-of-00002.safetensors missing (model.safetensors.index.json "
                                  "names 1 shard not in the snapshot): download it again")
    assert found["org/cut"].startswith("model-big.safetensors never arrived")
