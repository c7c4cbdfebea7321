"""A slow disk for the training tests, loaded by child processes that get this folder on PYTHONPATH.

A checkpoint of a real model on a network filesystem or a busy disk takes tens of seconds to write;
on this test machine it would take a fraction of one. With ``GAUDI_TEST_DISK_MBPS`` set, every
checkpoint file torch and safetensors write (model weights, optimizer, scheduler, RNG states) goes to
disk in 1 MiB chunks, each followed by ``fsync``, at that rate: the save really is slow, byte by byte
on the real file, and a process killed meanwhile leaves a really cut file. Nothing else changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import io
import os
import sys
import time
from typing import Any

_RATE = float(os.environ.get("GAUDI_TEST_DISK_MBPS", "0") or 0) * 1024 * 1024
_CHUNK = 1 << 20


def _slow_write(path: Any, data: bytes) -> None:
    start = time.monotonic()
    with open(path, "wb") as fh:
        for offset in range(0, len(data), _CHUNK):
            fh.write(data[offset:offset + _CHUNK])
            fh.flush()
            os.fsync(fh.fileno())
            due = start + (offset + _CHUNK) / _RATE
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def _patch_torch(module: Any) -> None:
    original = module.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(f, (str, os.PathLike)):
            return original(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        original(obj, buffer, *args, **kwargs)
        _slow_write(f, buffer.getvalue())
        return None

    module.save = save


def _patch_safetensors(module: Any) -> None:
    def save_file(tensors: Any, filename: Any, metadata: Any = None) -> None:
        _slow_write(filename, module.save(tensors, metadata=metadata))

    module.save_file = save_file


_PATCHES = {"torch": _patch_torch, "safetensors.torch": _patch_safetensors}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _PATCHES[self.name](module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, name)
                return spec
        return None


if _RATE > 0:
    sys.meta_path.insert(0, _Finder())
