"""Build the offline demo: a tiny Llama-style causal LM and its tokenizer, trained on a bundled text.

``python -m gaudi_gui.workers.demo DIR`` writes a model folder that ``from_pretrained`` loads offline:
a byte-level BPE tokenizer trained with ``tokenizers`` on ``resources/demo/corpus.txt``, a
ChatML chat template, and a 2-layer model (hidden size 64) that is briefly pre-trained on the same text
so that what it generates looks like words rather than noise. Everything is seeded, so two builds match.

Progress is reported as protocol events (``demo_progress``, ``demo_done``) on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gaudi_gui.core import paths, protocol

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
VOCAB_SIZE = 640
HIDDEN = 64
LAYERS = 2
CONTEXT = 512


def _emit(kind: str, **fields: object) -> None:
    protocol.write_line(sys.stdout, protocol.event(kind, **fields))


def build_tokenizer(corpus: Path, out_dir: Path) -> object:
    """Train the byte-level BPE tokenizer and save it as a transformers fast tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train([str(corpus)], vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS,
              show_progress=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|pad|>",
        unk_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = CONTEXT
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def build_model(tokenizer: object, corpus: Path, out_dir: Path, pretrain_steps: int, seed: int) -> dict:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tok = tokenizer  # PreTrainedTokenizerFast
    config = LlamaConfig(
        vocab_size=len(tok),  # type: ignore[arg-type]
        hidden_size=HIDDEN, intermediate_size=HIDDEN * 2, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tok.pad_token_id,  # type: ignore[attr-defined]
    )
    model = LlamaForCausalLM(config)
    ids = tok(corpus.read_text(encoding="utf-8"))["input_ids"]  # type: ignore[operator]
    data = torch.tensor(ids, dtype=torch.long)
    losses: list[float] = []
    if pretrain_steps > 0 and len(data) > 65:
        # A few hundred steps of next-token training on the corpus: enough for word-like output.
        optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
        block, batch = 64, 16
        model.train()
        for step in range(pretrain_steps):
            starts = torch.randint(0, len(data) - block - 1, (batch,))
            x = torch.stack([data[s:s + block] for s in starts.tolist()])
            out = model(input_ids=x, labels=x)
            out.loss.backward()
            optim.step()
            optim.zero_grad()
            losses.append(float(out.loss))
            if step % 25 == 0 or step == pretrain_steps - 1:
                _emit("demo_progress", step=step + 1, steps=pretrain_steps, loss=losses[-1])
        model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tok.pad_token_id, max_new_tokens=64,  # type: ignore[attr-defined]
    )
    model.save_pretrained(str(out_dir))
    return {"parameters": sum(p.numel() for p in model.parameters()),
            "final_loss": losses[-1] if losses else None, "pretrain_steps": pretrain_steps}


def build_demo_model(out_dir: Path, *, corpus: Path | None = None, pretrain_steps: int = 300,
                     seed: int = 0, force: bool = False) -> Path:
    """Write the demo model into ``out_dir`` (atomically: a half-built folder is never left there)."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file() and not force:
        return out_dir
    corpus = corpus or paths.demo_corpus_path()
    if not corpus.is_file():
        raise FileNotFoundError(f"demo corpus not found: {corpus}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=".demo-build-", dir=out_dir.parent))
    try:
        tokenizer = build_tokenizer(corpus, staging)
        info = build_model(tokenizer, corpus, staging, pretrain_steps, seed)
        info["built_in_s"] = round(time.perf_counter() - started, 2)
        info["recipe_version"] = paths.DEMO_MODEL_VERSION
        (staging / "gaudi_gui_demo.json").write_text(json.dumps(info, indent=2))
        if force and out_dir.exists():
            shutil.rmtree(out_dir)
        try:
            os.replace(staging, out_dir)
        except OSError:
            # Another process finished the same build first; its folder is as good as ours.
            if not (out_dir / "config.json").is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def ensure_demo_model() -> Path:
    """The cached demo model folder, built on first use."""
    return build_demo_model(paths.demo_model_dir())


def resolve_model(model: str) -> str:
    """A model argument as ``from_pretrained`` takes it: the demo id becomes its (built) folder."""
    if paths.is_demo(model):
        return str(ensure_demo_model())
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.workers.demo",
                                     description="Build the offline demo model.")
    parser.add_argument("out_dir", nargs="?", help="target folder (default: the user cache)")
    parser.add_argument("--steps", type=int, default=300, help="pre-training steps (0: random weights)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the folder exists")
    args = parser.parse_args(argv)
    out = Path(args.out_dir) if args.out_dir else paths.demo_model_dir()
    if args.steps < 0:
        parser.error("--steps must be >= 0")
    try:
        result = build_demo_model(out, pretrain_steps=args.steps, force=args.force)
    except (OSError, ValueError, paths.DataFileError) as exc:
        _emit("error", message=str(exc))
        print(f"error: {exc}", file=sys.stderr)
        return 1
    info = {}
    with contextlib.suppress(OSError, ValueError):
        info = json.loads((result / "gaudi_gui_demo.json").read_text())
    _emit("demo_done", path=str(result), **info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
