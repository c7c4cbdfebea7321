"""Where gaudi-gui keeps its files.

Everything lives under the XDG base directories, or under ``$GAUDI_GUI_HOME`` when it is set (tests and
portable installs set it so nothing touches the user's real folders).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Model and dataset ids that name the bundled offline demo instead of a Hub id or a folder.
#: A colon can never appear in a Hub id, so these cannot collide with a real repository.
DEMO_MODEL_ID = "builtin:demo"
DEMO_DATASET_ID = "builtin:demo"
#: Bump when the demo model's recipe changes so old caches are rebuilt rather than reused.
DEMO_MODEL_VERSION = 1


def _home() -> Path | None:
    value = os.environ.get("GAUDI_GUI_HOME")
    return Path(value).expanduser() if value else None


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    return Path(value).expanduser() if value else Path.home() / fallback


def config_dir() -> Path:
    home = _home()
    return home / "config" if home else _xdg("XDG_CONFIG_HOME", ".config") / "gaudi-gui"


def data_dir() -> Path:
    home = _home()
    return home / "data" if home else _xdg("XDG_DATA_HOME", ".local/share") / "gaudi-gui"


def cache_dir() -> Path:
    home = _home()
    return home / "cache" if home else _xdg("XDG_CACHE_HOME", ".cache") / "gaudi-gui"


def runs_dir() -> Path:
    """Root of the training run folders (one folder per launch)."""
    value = os.environ.get("GAUDI_GUI_RUNS_DIR")
    return Path(value).expanduser() if value else data_dir() / "runs"


def demo_model_dir() -> Path:
    # GAUDI_GUI_DEMO_MODEL_DIR lets tests (and air-gapped installs) share one prebuilt demo model.
    value = os.environ.get("GAUDI_GUI_DEMO_MODEL_DIR")
    return Path(value).expanduser() if value else cache_dir() / f"demo-model-v{DEMO_MODEL_VERSION}"


def resources_dir() -> Path:
    """The repository's ``resources/`` folder (the package is installed editable by ``make``)."""
    return Path(__file__).resolve().parents[2] / "resources"


def demo_corpus_path() -> Path:
    return resources_dir() / "demo" / "corpus.txt"


def demo_dataset_path() -> Path:
    return resources_dir() / "demo" / "dataset.jsonl"


def is_demo(model_or_dataset: str) -> bool:
    return model_or_dataset.strip() in (DEMO_MODEL_ID, DEMO_DATASET_ID)
