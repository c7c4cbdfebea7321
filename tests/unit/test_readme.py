"""The README stays a front page: what it is, the two commands, a picture (issue 37, item 15); the
rest lives in docs/, and every link between them leads somewhere."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: [text](target) where the target is a file of this repository (not a URL, not an anchor)
LINK = re.compile(r"\]\(((?!https?://|#|mailto:)[^)\s#]+)(#[^)]*)?\)")


def test_the_readme_is_at_most_150_lines_and_names_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150, len(text.splitlines())
    assert "make run" in text and "make test" in text
    assert "](docs/" in text and ".png)" in text  # the rest is linked; a picture is shown


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in LINK.finditer(page.read_text(encoding="utf-8")):
            target = (page.parent / match.group(1)).resolve()
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {match.group(1)}")
    assert not broken, broken
