"""Which cards a job may use, and the environment that tells a child process so.

Gaudi: ``HABANA_VISIBLE_MODULES`` takes module ids (the physical OAM slot, stable across reboots).
Intel supports partial-server jobs on 2 or 4 cards in fixed groups only (a job on one card is not a
partial-server job and needs no group). CUDA: ``CUDA_VISIBLE_DEVICES``
takes indices. Device visibility is fixed when a process starts, which is why it is an environment of
the child and never something the Qt process could change later.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Intel's supported partial-server groups (module ids). A full server (all cards) is always fine.
SUPPORTED_GROUPS: tuple[frozenset[int], ...] = tuple(
    frozenset(g) for g in ((0, 1), (2, 3), (4, 5), (6, 7), (0, 1, 2, 3), (4, 5, 6, 7))
)


def format_ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(set(ids)))


def parse_cards(text: str) -> list[int]:
    """``--cards``: card ids (module ids on Gaudi, indexes on CUDA) as comma-separated non-negative
    integers, e.g. ``2,3``; ValueError with one readable line on anything else (an empty list too)."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p.isascii() or not p.isdigit() for p in parts):
        raise ValueError(f"--cards takes card ids separated by commas (e.g. 2,3), not {text!r}")
    return sorted({int(p) for p in parts})


def cards_argv(ids: Sequence[int]) -> list[str]:
    """``--cards IDS`` for a host's ``gaudi-gui train`` ([] for no selection: all of its cards)."""
    return ["--cards", format_ids(ids)] if ids else []


def selection_warnings(kind: str, selected: Sequence[int], available: Sequence[int],
                       claims: Mapping[str, Sequence[int]] | None = None) -> list[str]:
    """Human-readable problems with a card selection (empty list: fine).

    ``kind`` is "hpu", "cuda" or "cpu"; ``available`` lists the ids present; ``claims`` maps another
    running job's name to the ids it uses.
    """
    warnings: list[str] = []
    chosen = set(selected)
    missing = sorted(chosen - set(available))
    if missing:
        warnings.append(f"card(s) {format_ids(missing)} are not present on this machine")
    # One card is a single-card job, not a partial-server one: Intel's 2/4 groups are about several
    # multi-card jobs sharing one server.
    if kind == "hpu" and len(chosen) > 1 and chosen != set(available):
        if len(chosen) not in (2, 4):
            warnings.append(
                f"{len(chosen)} card(s) selected: Intel supports partial-server jobs on 2 or 4 cards only"
            )
        elif frozenset(chosen) not in SUPPORTED_GROUPS:
            groups = " / ".join(format_ids(g) for g in SUPPORTED_GROUPS if len(g) == len(chosen))
            warnings.append(
                f"modules {format_ids(chosen)} are not a supported group; use one of {groups}"
            )
    for job, ids in (claims or {}).items():
        overlap = chosen & set(ids)
        if overlap:
            warnings.append(f"card(s) {format_ids(overlap)} are in use by {job}")
    return warnings


def device_env(kind: str, selected: Sequence[int]) -> dict[str, str]:
    """The variables that restrict a child to the selected cards (empty selection: all cards)."""
    env: dict[str, str] = {}
    if kind == "hpu":
        # transformers/torch on Gaudi need 64-bit integer support for many models' index ops.
        env["PT_ENABLE_INT64_SUPPORT"] = "1"
        if selected:
            env["HABANA_VISIBLE_MODULES"] = format_ids(selected)
    elif kind == "cuda" and selected:
        env["CUDA_VISIBLE_DEVICES"] = format_ids(selected)
    return env


def child_env(extra: Mapping[str, str] | None = None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The full environment for a worker child: the current one plus unbuffered output and ``extra``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if extra:
        env.update({str(k): str(v) for k, v in extra.items()})
    return env


#: What to install so that jobs use Gaudi cards (shown in the Devices tab's banner).
HABANA_INSTALL_HINT = ("install Intel's habana-torch-plugin (module habana_frameworks, with Intel's own "
                       "torch build) through the Intel Gaudi software installer, or run gaudi-gui in an "
                       "Intel Gaudi container; it is not on PyPI")


def jobs_device(kind: str, info: Mapping[str, Any] | None) -> str:
    """Where jobs will really run: ``kind`` (what hl-smi / nvidia-smi see) unless the environment probe
    (``gaudi_gui.workers.probe.collect``) says the job's Python cannot use those cards. Before a probe
    result (``info`` None) the cards are assumed usable."""
    if info is None or kind == "cpu":
        return kind
    if kind == "hpu" and not (info.get("habana_frameworks") and info.get("is_torch_hpu_available")):
        return "cuda" if int(info.get("cuda_count") or 0) > 0 else "cpu"
    if kind == "cuda" and int(info.get("cuda_count") or 0) <= 0:
        return "cpu"
    return kind


def runtime_mismatch(kind: str, info: Mapping[str, Any] | None) -> str | None:
    """A sentence for a banner when the cards the device tools see will not be used by jobs."""
    used = jobs_device(kind, info)
    if used == kind or info is None:
        return None
    where = {"cpu": "the CPU", "cuda": "the NVIDIA GPU(s)"}.get(used, used)
    python = info.get("executable") or "the app's Python"
    if kind == "hpu":
        if not info.get("habana_frameworks"):
            return (f"hl-smi sees Gaudi cards, but {python} has no habana_frameworks: jobs will run on "
                    f"{where}. To use the cards, {HABANA_INSTALL_HINT}.")
        error = (info.get("errors") or {}).get("hpu")
        return (f"habana_frameworks is installed, but torch in {python} sees no usable HPU"
                f"{f' ({error})' if error else ''}: jobs will run on {where}. Check the driver, "
                "HABANA_VISIBLE_MODULES and that habana-torch-plugin matches the installed torch.")
    return (f"nvidia-smi sees NVIDIA GPUs, but torch in {python} cannot use them (a CPU-only build?): "
            f"jobs will run on {where}. Install a CUDA build of torch to use them.")
