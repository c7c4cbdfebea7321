"""``remote.failure_kind``: the kind of a sentence about reaching a host, given back from its words (a
request through the agent fails with words only), for each sentence ``explain_ssh_failure`` makes."""

from __future__ import annotations

import pytest

from gaudi_gui.core import remote

STDERR = {
    "auth": "user@127.0.0.1: Permission denied (publickey).",
    "hostkey": "Host key verification failed.",
    "unreachable": "ssh: Could not resolve hostname nowhere: Name or service not known",
    "dropped": "Connection to 127.0.0.1 closed by remote host.",
    "ssh": "something else entirely",
}


@pytest.mark.parametrize("kind", sorted(STDERR))
@pytest.mark.parametrize("dest", ["gg-remote", "me@box.example", "odd'name"])
def test_every_explained_failure_keeps_its_kind(kind: str, dest: str) -> None:
    said, words = remote.explain_ssh_failure(dest, STDERR[kind])
    assert said == kind
    assert remote.failure_kind(dest, words) == kind


def test_the_links_own_sentences_and_other_words() -> None:
    refused = remote.explain_ssh_failure("gg-remote", "ssh: connect to host 127.0.0.1 port 1: "
                                                      "Connection refused")
    assert remote.failure_kind("gg-remote", refused[1]) == "unreachable"
    assert remote.failure_kind("gg-remote", "the connection to gg-remote was lost") == "dropped"
    assert remote.failure_kind("gg-remote", "gg-remote has no gaudi-gui agent behind `python -m gaudi_gui` "
                                            "(exit 127); fix: gaudi-gui hosts --setup gg-remote") == "missing"
    # Another host's sentence, or the worker's own words: no kind.
    assert remote.failure_kind("gg-remote", "the connection to gg-remote-b was lost") == ""
    assert remote.failure_kind("gg-remote", "the model worker exited with code 1") == ""
