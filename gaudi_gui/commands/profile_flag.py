"""``--profile-steps N`` (issue 40): the option, its one-line refusal, and the job key it sets.

Its own module: ``train``, ``remote_run``, ``multi_host`` and ``slurm_run`` each load the job and put
the option into it (a host's, a Slurm node's own ``train`` reads it from the job there), and
``train`` imports ``slurm_run`` already.
"""

from __future__ import annotations

import argparse

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.profile import PROFILE_SKIP_STEPS


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile-steps", dest="profile_steps", type=profile_steps, default=0, metavar="N",
                   help="record N training steps with torch.profiler after a warm-up of "
                        f"{PROFILE_SKIP_STEPS} steps (rank 0): the trace and its summary go to the run "
                        "folder's profile/ (the job file's profile_steps; see docs/profile.md)")


def profile_steps(text: str) -> int:
    """``--profile-steps``: a whole number above 0 (one line and exit 2 otherwise, while parsing)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of steps above 0 "
                                         f"(leave the option out for no profile)")
    return value


def apply_profile_steps(job: JobConfig, args: argparse.Namespace) -> None:
    """``--profile-steps`` travels in the job (a host's, a Slurm node's ``train`` reads it there)."""
    steps = int(getattr(args, "profile_steps", 0) or 0)
    if steps > 0:
        job.profile_steps = steps
