"""Which host's end ended a multi-host run, when several hosts end within a moment of each other."""

from __future__ import annotations

from gaudi_gui.core.multi_host import consequence, first_cause

# Heard on a fresh clone: host B's rank was killed; host A's rank, in a gloo all_gather with it, failed
# a moment later and its end reached this machine first.
PEER_LOST = ("Failed at step 2: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
             "pair.cc:553] Connection closed by peer [127.0.0.1]:16035. This is typically caused by a "
             "remote worker crashing. Check the logs of the remote worker before reporting an error.")
KILLED = "Killed at step 0 — a training process was killed by SIGKILL; no checkpoint"
ENDED_BY_US = "Killed at step 5 — killed on request; no checkpoint"
OOM = "Failed at step 3: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
NCCL = "Failed at step 9: DistBackendError: NCCL communicator was aborted on rank 1."


def test_the_host_whose_rank_died_is_the_cause_not_the_peer_that_heard_first() -> None:
    assert consequence(PEER_LOST) and consequence(NCCL) and consequence(ENDED_BY_US)
    assert not consequence(KILLED) and not consequence(OOM)
    assert first_cause([PEER_LOST, KILLED]) == 1
    assert first_cause([KILLED, PEER_LOST]) == 0
    # A real failure first: the others' "killed on request" (the run's end of them) is its consequence.
    assert first_cause([OOM, ENDED_BY_US]) == 0
    assert first_cause([NCCL, ENDED_BY_US, OOM]) == 2
    # Nothing but consequences (the cause was never heard of): the first heard of.
    assert first_cause([PEER_LOST, NCCL]) == 0
    assert first_cause(["unreachable for 60 s"]) == 0
