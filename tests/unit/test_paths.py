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


def test_the_data_files_have_one_copy_in_the_top_level_resources_folder() -> None:
    """Issue 37 item 14: the layout is pyproject.toml, gaudi_gui/, resources/, tests/ — one copy of the
    data, at the top (the wheel gets it mapped into the package: test_wheel_install)."""
    root = Path(paths.__file__).resolve().parents[2]
    assert not (root / "gaudi_gui" / "resources").exists()
    for name in paths.DATA_FILES:
        assert paths.data_file(name).is_relative_to(root / "resources"), name


def test_the_wheel_lists_every_subpackage() -> None:
    """pyproject.toml names the packages one by one (a mapped package-dir cannot be found by
    setuptools' find): a subpackage left out of the list would be missing from every host's install."""
    import re

    root = Path(paths.__file__).resolve().parents[2]
    table = (root / "pyproject.toml").read_text().split("[tool.setuptools]", 1)[1]
    block = re.search(r"^packages = \[(.*?)\]", table, re.S | re.M)
    assert block is not None, "pyproject.toml: [tool.setuptools] packages = [...] not found"
    listed = set(re.findall(r'"([\w.]+)"', block.group(1)))
    found = {".".join(init.parent.relative_to(root).parts)
             for init in (root / "gaudi_gui").rglob("__init__.py")}
    assert found | {"gaudi_gui.resources", "gaudi_gui.resources.demo"} == listed


def test_a_missing_data_file_says_the_installation_is_incomplete(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Not an empty table: an installation without its data (a wheel without package data) says so."""
    from gaudi_gui.core import health

    monkeypatch.setattr(paths, "resources_dir", lambda: tmp_path)
    with pytest.raises(paths.DataFileError, match=r"demo/corpus.txt is missing .*incomplete"):
        paths.demo_corpus_path()
    with pytest.raises(paths.DataFileError, match=r"gaudi-compat\.json is missing"):
        health.load_compat()
    (finding,) = health.stack_findings({"driver": "1.18.0", "torch": "2.4.0"})
    assert (finding.check, finding.severity) == ("stack.compat", "error")
    assert "installation is incomplete" in finding.seen
    (tmp_path / "gaudi-compat.json").write_text("{not json")
    with pytest.raises(paths.DataFileError, match="cannot be read"):
        health.load_compat()
