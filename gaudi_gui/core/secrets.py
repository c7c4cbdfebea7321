"""Keeping secrets off disk and off the screen.

A run folder records how a job ran, not the user's credentials: only the variables the app set are
written, and the names (never the values) of the secret-looking ones it passed through. Text shown
or saved (the command preview, logs) goes through ``redact``. Qt-free.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# Whole name segments: HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY; not TOKENIZERS_PARALLELISM.
_SECRET_NAME = re.compile(r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|API_?KEY|ACCESS_KEY|"
                          r"PRIVATE_KEY|AUTH)(?:_|$)", re.IGNORECASE)
#: Training arguments that hold credentials; they come from the environment or the HF token store.
SECRET_TRAINING_ARGS = ("hub_token", "push_to_hub_token")

_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),                        # Hugging Face tokens
    re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{20,}\b"),            # OpenAI-style keys
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),                           # AWS access key ids
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"),                 # GitHub tokens
    re.compile(r"\b[0-9a-f]{40}\b(?=.*(?:wandb|WANDB))"),          # W&B keys named on the line
]
# NAME=value / --name value / "name": "value" where the name looks secret.
# Case-sensitive on purpose: upper-case variable names, or the few lower-case argument names that
# hold credentials ("max_new_tokens 40" is not a secret).
_ASSIGN = re.compile(
    r"(?P<key>\b(?:[A-Z0-9]+_)*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|SECRET_ACCESS_KEY)"
    r"(?:_[A-Z0-9]+)*|\b(?:hub_token|api_key|access_token|auth_token))\b"
    r"(?P<sep>\s*=\s*|\s+|\"?\s*:\s*\"?)(?P<value>[^\s\"',}]+)")
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact(text: str) -> str:
    """``text`` with anything that looks like a credential replaced by ``***``."""
    if not text:
        return text
    for pattern in _PATTERNS:
        text = pattern.sub(REDACTED, text)

    def repl(match: re.Match[str]) -> str:
        value = match.group("value")
        if value == REDACTED or value.lower() in ("none", "null", "false", "true", ""):
            return match.group(0)
        return f"{match.group('key')}{match.group('sep')}{REDACTED}"
    return _ASSIGN.sub(repl, text)


def recorded_env(env_set: Mapping[str, str], inherited: Iterable[str]) -> dict[str, Any]:
    """What a run folder's env.json holds: the variables the app set (secret-looking values
    redacted) and the sorted names of inherited secret-looking variables (values never)."""
    return {
        "set_by_gaudi_gui": {k: (REDACTED if is_secret_name(k) else v) for k, v in sorted(env_set.items())},
        "inherited_secret_names": sorted({k for k in inherited if is_secret_name(k)} - set(env_set)),
    }


def strip_secret_args(training_args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Training arguments without credentials, and the names removed."""
    removed = [k for k in SECRET_TRAINING_ARGS if training_args.get(k)]
    return {k: v for k, v in training_args.items() if k not in SECRET_TRAINING_ARGS}, removed


def hub_token_available(env: Mapping[str, str] | None = None) -> bool:
    """Whether huggingface_hub will find a token: HF_TOKEN (or the older HUGGING_FACE_HUB_TOKEN), or the
    token file ``hf auth login`` writes (HF_TOKEN_PATH, else HF_HOME/token, else
    ~/.cache/huggingface/token). Only that one exists is looked at; the value is never read."""
    env = os.environ if env is None else env
    if env.get("HF_TOKEN", "").strip() or env.get("HUGGING_FACE_HUB_TOKEN", "").strip():
        return True
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = env.get("HF_HOME") or str(cache / "huggingface")
    path = Path(env.get("HF_TOKEN_PATH") or Path(home) / "token").expanduser()
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


__all__ = ["REDACTED", "SECRET_TRAINING_ARGS", "hub_token_available", "is_secret_name", "recorded_env",
           "redact", "strip_secret_args"]
