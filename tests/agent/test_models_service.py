"""The agent's ``models.list`` and ``models.delete`` (the Models tab's listing and Delete…): the agent's own
Hub cache read and one revision deleted in the agent (a worker thread of its loop, no child), with the
request's arguments checked where they enter and refused in one sentence."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core.agentwire import AgentError, Connection


def _revision(hub_dir: Path, repo_id: str, commit: str, data: bytes, ref: str = "") -> None:
    """One revision of ``repo_id`` in the Hub cache as huggingface_hub writes it (a blob, a snapshot
    linking to it, a ref)."""
    repo = hub_dir / ("models--" + repo_id.replace("/", "--"))
    blob = hashlib.sha256(data).hexdigest()
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "blobs" / blob).write_bytes(data)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "model.safetensors").symlink_to(f"../../blobs/{blob}")
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)


def test_list_and_delete_one_revision_and_bad_arguments_refused(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # the agent (started below) inherits it
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    hub_dir = tmp_path / "hf" / "hub"
    old, new = "a1" + "0" * 38, "a2" + "0" * 38
    _revision(hub_dir, "org/two", old, b"o" * 1000)
    _revision(hub_dir, "org/two", new, b"n" * 3000, ref="main")

    with Connection.open() as conn:
        listed = conn.request("models.list")
        assert listed["cache_dir"] == str(hub_dir) and isinstance(listed["free_bytes"], int)
        [model] = listed["models"]
        assert model["repo_id"] == "org/two" and model["size_on_disk"] == 4000
        assert {r["commit"]: r["refs"] for r in model["revisions"]} == {old: [], new: ["main"]}

        refusals: dict[str, tuple[dict[str, Any], str]] = {
            "no repo_id": ({"revision": old}, "'repo_id' is a Hub model id"),
            "not an id": ({"repo_id": "../etc", "revision": old}, "is not a Hub model id"),
            "no revision": ({"repo_id": "org/two"}, "'revision' names the revision to delete"),
            "an option": ({"repo_id": "org/two", "revision": "--all"}, "is not a commit or a ref"),
            "a space": ({"repo_id": "org/two", "revision": "a1 a2"}, "is not a commit or a ref"),
            "two specs": ({"repo_id": "org/two", "revision": "a1@main"}, "is not a commit or a ref"),
            "a number": ({"repo_id": "org/two", "revision": 7}, "'revision' names the revision"),
            "two match": ({"repo_id": "org/two", "revision": "a"}, "matches 2 revisions of org/two"),
            "none match": ({"repo_id": "org/two", "revision": "ffff"}, "has no cached revision 'ffff'"),
            "not cached": ({"repo_id": "org/other", "revision": "main"}, "org/other is not in the Hub cache"),
        }
        for case, (args, words) in refusals.items():
            with pytest.raises(AgentError, match=words):
                conn.request("models.delete", **args)
            assert (hub_dir / "models--org--two" / "snapshots" / old).is_dir(), case

        deleted = conn.request("models.delete", repo_id="org/two", revision="a1")
        assert deleted == {**deleted, "deleted": True, "repo_id": "org/two", "revisions": [old],
                           "freed_bytes": 1000}
        assert not (hub_dir / "models--org--two" / "snapshots" / old).exists()
        [model] = conn.request("models.list")["models"]
        assert [r["commit"] for r in model["revisions"]] == [new]
        # A ref names a revision too (what `gaudi-gui models --delete org/two@main` takes).
        assert conn.request("models.delete", repo_id="org/two", revision="main")["revisions"] == [new]
        assert conn.request("models.list")["models"] == []
