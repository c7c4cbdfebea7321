"""``python -m gaudi_gui.workers.benchmark``: one rank of ``gaudi-gui benchmark`` (one card).

Reads its job (JSON, one line on stdin: device, size, repeats, rank, world, card, port) and prints
protocol events: ``bench_device`` (what torch sees), ``bench_sample`` (workload, card, repeat, value,
unit) for every measured sample, ``phase`` and ``error``. The command (commands/benchmark.py) starts
one rank per chosen card, each restricted to its card (HABANA_VISIBLE_MODULES / CUDA_VISIBLE_DEVICES),
so the matmul roofline is measured per card, concurrently, as a job uses them.

Workloads (core.benchmark.WORKLOADS), their repeats interleaved (core.benchmark.interleaved), each
preceded by a barrier of the ranks and an untimed warm-up:
- matmul roofline: bf16 on a card (fp8 too where torch has a scaled fp8 matmul for it: CUDA 8.9+);
  on the CPU fp32, since a CPU's bf16 matmul is often emulated and slow: the figure says which.
- copy host ↔ device (on a card only): a pinned host buffer on CUDA.
- all-reduce (two or more ranks): gloo on the CPU, NCCL on CUDA, HCCL on Gaudi; bus bandwidth.
- decode tokens/s and one training step (tokens/s) of the bench model (rank 0): a Llama of the
  size's dimensions with random, seeded weights, greedy, a fixed number of new tokens.
Imports torch: a worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import signal
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from gaudi_gui.core import benchmark as bm
from gaudi_gui.core import protocol

#: Runs of a workload per sample, at least (the sample is their median).
MIN_ITERS = 3
#: Runs of a collective per sample: a fixed count, the same on every rank (a rank deciding by its own
#: clock would wait forever for a partner that stopped one run earlier).
COLLECTIVE_RUNS = 8


def _emit(event_type: str, **fields: Any) -> None:
    protocol.write_line(sys.stdout, protocol.encode({"type": event_type, **fields}))


def _die_with_parent() -> None:
    """The command's death ends this rank (Linux): it never holds a card alone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


class Rank:
    """The workloads of one rank on its device."""

    def __init__(self, job: dict[str, Any]) -> None:
        import torch

        self.torch = torch
        self.job = job
        self.size = bm.SIZES[str(job["size"])]
        self.rank, self.world = int(job.get("rank", 0)), int(job.get("world", 1))
        self.card = str(job.get("card", "0"))
        from gaudi_gui.workers import device as device_mod

        # A named device this process cannot use is said as such (device_mod.Unsupported), not as an
        # import error deep in a workload.
        self.device = device_mod.resolve(str(job["device"]))
        if self.device == "hpu":
            import habana_frameworks.torch.core  # registers the hpu device
        self.dev = torch.device(self.device if self.device == "cpu" else f"{self.device}:0")
        if self.device == "cuda":
            torch.cuda.set_device(0)
        self.dist: Any = None
        if self.world > 1:
            import torch.distributed as dist

            backend = {"cpu": "gloo", "cuda": "nccl", "hpu": "hccl"}[self.device]
            if self.device == "hpu":
                import habana_frameworks.torch.distributed.hccl  # noqa: F401
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{int(job['port'])}",
                                    rank=self.rank, world_size=self.world)
            self.dist = dist

    # -- timing -------------------------------------------------------------------------------------
    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        elif self.device == "hpu":
            self.torch.hpu.synchronize()  # type: ignore[attr-defined]

    def timed(self, step: Callable[[], None], runs: int = 0) -> list[float]:
        """Seconds of each run of ``step`` (each synchronised), repeated until the size's minimum time
        has passed and at least ``MIN_ITERS`` times; or exactly ``runs`` times (a collective: every
        rank must run it as often as the others)."""
        self.sync()
        times: list[float] = []
        start = time.perf_counter()
        while (len(times) < runs) if runs else \
                (len(times) < MIN_ITERS or time.perf_counter() - start < self.size.min_s):
            began = time.perf_counter()
            step()
            self.sync()
            times.append(time.perf_counter() - began)
        return times

    # -- workloads ----------------------------------------------------------------------------------
    def workloads(self) -> list[str]:
        keys = ["matmul.fp32"] if self.device == "cpu" else ["matmul.bf16"]
        if self._fp8():
            keys.append("matmul.fp8")
        if self.device != "cpu":
            keys += ["copy.h2d", "copy.d2h"]
        if self.world > 1:
            keys.append("allreduce")
        return [*keys, "decode", "train_step"]

    def _fp8(self) -> bool:
        torch = self.torch
        return (self.device == "cuda" and hasattr(torch, "_scaled_mm")
                and torch.cuda.get_device_capability(0) >= (8, 9))

    def prepare(self, key: str) -> Callable[[], float] | None:
        """A function measuring one sample of ``key`` (its value), or None where this rank does not
        run it (the bench model's workloads run on rank 0)."""
        torch, size = self.torch, self.size
        if key.startswith("matmul."):
            n = size.matmul_n
            dtype = {"matmul.fp32": torch.float32, "matmul.bf16": torch.bfloat16}.get(key, torch.bfloat16)
            gen = torch.Generator(device="cpu").manual_seed(self.rank)
            a = torch.randn(n, n, generator=gen).to(self.dev, dtype)
            b = torch.randn(n, n, generator=gen).to(self.dev, dtype)
            if key == "matmul.fp8":
                a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
                one = torch.ones((), device=self.dev)

                def op() -> None:
                    torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            else:
                def op() -> None:
                    torch.matmul(a, b)
            return lambda: self._rate(op, 2.0 * n ** 3 / 1e12)
        if key in ("copy.h2d", "copy.d2h"):
            count = size.copy_mib * (1 << 20) // 4
            host = torch.empty(count, dtype=torch.float32)
            if self.device == "cuda":
                host = host.pin_memory()
            card = torch.empty(count, dtype=torch.float32, device=self.dev)
            if key == "copy.h2d":
                def op() -> None:
                    card.copy_(host, non_blocking=False)
            else:
                def op() -> None:
                    host.copy_(card, non_blocking=False)
            return lambda: self._rate(op, count * 4 / 1e9)
        if key == "allreduce":
            count = size.allreduce_mib * (1 << 20) // 4
            data = torch.ones(count, dtype=torch.float32, device=self.dev)
            bus = 2.0 * (self.world - 1) / self.world * count * 4 / 1e9

            def op() -> None:
                self.dist.all_reduce(data)
            return lambda: self._rate(op, bus, runs=COLLECTIVE_RUNS)
        if self.rank != 0:
            return None
        ids = torch.randint(0, size.vocab, (size.batch, size.seq),
                            generator=torch.Generator(device="cpu").manual_seed(0)).to(self.dev)
        if key == "decode":
            model = self._model(train=False)
            prompt = ids[:, : max(1, size.seq // 2)]

            def op() -> None:
                with torch.no_grad():
                    model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                   max_new_tokens=size.new_tokens, min_new_tokens=size.new_tokens,
                                   do_sample=False, pad_token_id=0)
            return lambda: self._rate(op, size.batch * size.new_tokens)
        if key == "train_step":
            model = self._model(train=True)
            optim = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def op() -> None:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                optim.step()
                optim.zero_grad(set_to_none=True)
            return lambda: self._rate(op, size.batch * size.seq)
        return None

    def _rate(self, op: Callable[[], None], work: float, runs: int = 0) -> float:
        """``work`` per second of the median run of ``op`` in one sample: a moment the machine was busy
        elsewhere moves one run, not the sample."""
        return work / statistics.median(self.timed(op, runs))

    def _model(self, *, train: bool) -> Any:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch, size = self.torch, self.size
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=size.vocab, hidden_size=size.hidden,
                             intermediate_size=size.hidden * 2, num_hidden_layers=size.layers,
                             num_attention_heads=max(1, size.hidden // 64),
                             max_position_embeddings=size.seq + size.new_tokens, tie_word_embeddings=True,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0)
        dtype = torch.float32 if self.device == "cpu" else torch.bfloat16
        model = LlamaForCausalLM(config).to(self.dev, dtype)  # type: ignore[arg-type]
        model.train(train)
        return model

    def barrier(self) -> None:
        if self.dist is not None:
            self.dist.barrier()

    def run(self, repeats: int) -> None:
        keys = self.workloads()
        _emit("bench_plan", rank=self.rank, card=self.card, workloads=keys, repeats=repeats)
        measures: dict[str, Callable[[], float] | None] = {}
        for key in keys:
            self.barrier()
            _emit("phase", phase="warm-up", message=f"warming up {key}", rank=self.rank)
            measure = measures[key] = self.prepare(key)
            if measure is not None:
                measure()  # untimed: compiles, caches, first-touch pages
        for repeat, key in bm.interleaved(keys, repeats):
            self.barrier()
            measure = measures[key]
            if measure is None:
                continue
            value = measure()
            if key == "allreduce" and self.rank != 0:
                continue  # one figure for the ranks together: rank 0's
            _emit("bench_sample", workload=key, card=self.card, rank=self.rank, repeat=repeat, value=value,
                  unit=bm.WORKLOAD_OF[key].unit)
        self.barrier()
        if self.dist is not None:
            self.dist.destroy_process_group()

    def describe(self) -> dict[str, Any]:
        torch = self.torch
        name = "cpu"
        with contextlib.suppress(Exception):
            if self.device == "cuda":
                name = torch.cuda.get_device_name(0)
            elif self.device == "hpu":
                name = torch.hpu.get_device_name()
        return {"rank": self.rank, "card": self.card, "device": self.device, "name": name,
                "torch": torch.__version__, "threads": torch.get_num_threads()}


def main() -> int:
    _die_with_parent()
    try:
        job = json.loads(sys.stdin.readline())
        if str(job.get("size")) not in bm.SIZES:
            raise ValueError(f"size {job.get('size')!r}")
    except (ValueError, TypeError, AttributeError) as exc:
        _emit("error", kind="bad_input", message=f"bad job: {exc}")
        return 2
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            rank = Rank(job)
        _emit("bench_device", **rank.describe())
        rank.run(int(job.get("repeats", 3)))
    except Exception as exc:  # said as one event: the command names the rank and the workload
        _emit("error", kind="failed", message=f"rank {job.get('rank', 0)}: {type(exc).__name__}: {exc}"[:500])
        return 1
    _emit("done", rank=job.get("rank", 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
