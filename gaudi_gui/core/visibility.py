"""Which cards a job may use, and the environment that tells a child process so.

Gaudi: ``HABANA_VISIBLE_MODULES`` takes module ids (the physical OAM slot, stable across reboots).
Intel supports partial-server jobs on 2 or 4 cards in fixed groups only. CUDA: ``CUDA_VISIBLE_DEVICES``
takes indices. Device visibility is fixed when a process starts, which is why it is an environment of
the child and never something the Qt process could change later.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

#: Intel's supported partial-server groups (module ids). A full server (all cards) is always fine.
SUPPORTED_GROUPS: tuple[frozenset[int], ...] = tuple(
    frozenset(g) for g in ((0, 1), (2, 3), (4, 5), (6, 7), (0, 1, 2, 3), (4, 5, 6, 7))
)


def format_ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(set(ids)))


def parse_ids(text: str) -> list[int]:
    """'0,1, 3' -> [0, 1, 3]; raises ValueError with a readable message on anything else."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if not part.isdigit():
            raise ValueError(f"not a card id: {part!r} (expected numbers separated by commas)")
        out.append(int(part))
    return sorted(set(out))


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
    if kind == "hpu" and chosen and chosen != set(available):
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
