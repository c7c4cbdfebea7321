from __future__ import annotations

from pathlib import Path

import pytest

from gaudi_gui.core import paths


def test_home_override_puts_everything_under_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GAUDI_GUI_HOME", str(tmp_path))
    monkeypatch.delenv("GAUDI_GUI_DEMO_MODEL_DIR", raising=False)
    for folder in (paths.config_dir(), paths.data_dir(), paths.cache_dir(), paths.runs_dir(),
                   paths.demo_model_dir()):
        assert tmp_path in folder.parents


def test_bundled_demo_resources_exist() -> None:
    assert paths.demo_corpus_path().stat().st_size > 1000
    assert paths.is_demo(" builtin:demo ") and not paths.is_demo("gpt2")
