"""Merge and save: ``python -m gaudi_gui.workers.merge --adapter DIR --out DIR``.

Loads the adapter's base model (``adapter_config.json``'s ``base_model_name_or_path``) in full
precision, applies the adapter, merges it with peft's ``merge_and_unload`` and writes a plain model
folder (weights, config, tokenizer) that loads without peft. Prints one JSON line:
``{"ok": true, "path": OUT, "parameters": N}`` or ``{"ok": false, "message": ...}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


def merge(adapter: Path, out: Path) -> dict[str, Any]:
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    if not (adapter / "adapter_config.json").is_file():
        raise ValueError(f"{adapter} holds no adapter (adapter_config.json)")
    model = AutoPeftModelForCausalLM.from_pretrained(str(adapter))
    merged = model.merge_and_unload()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written next to the target and moved in place: a cut-short merge never looks like a model.
    staging = Path(tempfile.mkdtemp(prefix=".merge-", dir=out.parent))
    try:
        merged.save_pretrained(str(staging))
        AutoTokenizer.from_pretrained(str(adapter)).save_pretrained(str(staging))
        if out.exists():
            shutil.rmtree(out)
        staging.replace(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return {"ok": True, "path": str(out), "parameters": int(sum(p.numel() for p in merged.parameters()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.workers.merge")
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--out", required=True)
    ns = parser.parse_args(argv)
    try:
        result = merge(Path(ns.adapter).expanduser(), Path(ns.out).expanduser())
    except Exception as exc:  # one readable line for the UI, never a traceback
        result = {"ok": False, "message": f"cannot merge {ns.adapter}: {type(exc).__name__}: "
                                          f"{str(exc)[:400]}"}
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
