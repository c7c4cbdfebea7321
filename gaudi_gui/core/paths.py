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


#: The data files the package reads at run time, relative to ``resources_dir()``. They are package
#: data (pyproject.toml), so a wheel carries them; ``host_setup.build_wheel`` refuses a wheel without one.
DATA_FILES = ("gaudi-compat.json", "benchmark-reference.json", "demo/corpus.txt", "demo/dataset.jsonl",
              "demo/prompts.txt", "demo/preference.jsonl")


class DataFileError(RuntimeError):
    """A data file of the package is missing: the installation is incomplete (never an empty default).
    Not an OSError: callers that read an OSError as "no such model / no network" must not hide it."""


def resources_dir() -> Path:
    """Where the data files are: ``gaudi_gui/resources/`` in an installed wheel (the build maps the
    top-level ``resources/`` there, pyproject.toml), else the source tree's own top-level
    ``resources/`` (a checkout and an editable install: one copy, never a second inside the package)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "resources"
    return installed if installed.is_dir() else package.parent / "resources"


def data_file(name: str) -> Path:
    """The packaged data file ``name`` (one of ``DATA_FILES``); DataFileError when it is missing."""
    path = resources_dir() / name
    if not path.is_file():
        raise DataFileError(f"gaudi-gui's data file {name} is missing ({path} not found): this installation "
                            "is incomplete; reinstall gaudi-gui (its wheel carries them in "
                            "gaudi_gui/resources/)")
    return path


def demo_corpus_path() -> Path:
    return data_file("demo/corpus.txt")


def demo_dataset_path(objective: str = "sft") -> Path:
    """The demo dataset of a job's objective: question-and-answer text for SFT, the tiny preference set
    (prompt, chosen, rejected: plain pairs whose margins rise on the demo model) for DPO, ORPO, KTO."""
    return data_file("demo/dataset.jsonl" if objective in ("", "sft") else "demo/preference.jsonl")


def demo_prompts_path() -> Path:
    """The questions of the demo dataset, one a line: what Evaluate asks a demo run's base and tuned
    models (the base never saw the dataset's question-and-answer rows, so the two answer differently)."""
    return data_file("demo/prompts.txt")


def is_demo(model_or_dataset: str) -> bool:
    return model_or_dataset.strip() in (DEMO_MODEL_ID, DEMO_DATASET_ID)
