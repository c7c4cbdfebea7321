"""Keeping secrets off disk and off the screen.

A run folder records how a job ran, not the user's credentials: only the variables the app set are
written, and the names (never the values) of the secret-looking ones it passed through. Text shown
or saved (the command preview, logs, every part of ``doctor --report`` and the app's "Copy report")
goes through ``redact``, the one redaction of the package. Qt-free.
"""

from __future__ import annotations

import functools
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
# password: x / "db_password": "x" / Passwd = x / --password=x, whatever the case (a person's config
# or a library's log); a colon or an equals sign must follow, so prose ("the password is") stays.
_PASSWORD = re.compile(
    r"(?P<key>\b[\w.-]*(?:password|passwd|passphrase|secret)[\w-]*)(?P<sep>[\"']?[ \t]*[:=][ \t]*[\"']?)"
    r"(?P<value>[^\s\"',}]+)", re.IGNORECASE)
# Authorization: Bearer <token> (and a header's Basic credentials).
_BEARER = re.compile(r"(?P<key>\bbearer|\bauthorization\s*:\s*basic)(?P<sep>\s+)"
                     r"(?P<value>[A-Za-z0-9\-._~+/]{8,}=*)", re.IGNORECASE)
# scheme://user:password@host: the password up to the last "@" before the path.
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^\s/:@'\"]+:)[^\s/'\"]+@", re.IGNORECASE)
# PEM private keys: whole blocks (also on one line, as a JSON string), and the pieces a log's last
# lines keep of one (a block cut before its BEGIN line, or after it).
_PEM_BLOCK = re.compile(r"(?P<begin>-----BEGIN (?P<kind>[A-Z0-9 ]*?)PRIVATE KEY-----)(?P<body>.*?)"
                        r"(?P<end>-----END (?P=kind)PRIVATE KEY-----)", re.DOTALL)
_PEM_LINE = r"[ \t]*(?:[A-Za-z0-9+/=]+|(?:Proc-Type|DEK-Info|Comment):[^\n]*)[ \t]*"
_PEM_HEAD_CUT = re.compile(rf"(?m)^(?:{_PEM_LINE}\r?\n)+(?=[ \t]*-----END [A-Z0-9 ]*PRIVATE KEY-----)")
_PEM_TAIL_CUT = re.compile(rf"(?P<begin>-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----)"
                           rf"(?:\r?\n{_PEM_LINE}(?=\r?\n|\Z))+")
REDACTED = "***"
#: The environment's secret values shorter than this are not looked for in text: a value "1" or
#: "true" would blank every such digit or word of a log.
MIN_SECRET_VALUE_LEN = 6
_HARMLESS_VALUES = ("none", "null", "false", "true", "")


@functools.lru_cache(maxsize=1024)
def is_secret_name(name: str) -> bool:
    # Cached: redact looks at every variable's name for every line it is given.
    return bool(_SECRET_NAME.search(name))


def secret_values(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The values of the secret-named variables of ``env`` (default: this process's environment),
    trivially short ones left out, longest first (so no piece of a longer one is left behind)."""
    env = os.environ if env is None else env
    found = {value.strip() for name, value in env.items() if is_secret_name(name)}
    return tuple(sorted((v for v in found if len(v) >= MIN_SECRET_VALUE_LEN
                         and v.lower() not in _HARMLESS_VALUES), key=lambda v: (-len(v), v)))


@functools.lru_cache(maxsize=8)
def _values_pattern(values: tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(re.escape(v) for v in values)) if values else None


def _pem(match: re.Match[str]) -> str:
    newline = "\n" if "\n" in match.group("body") else ""
    return f"{match.group('begin')}{newline}{REDACTED}{newline}{match.group('end')}"


def _keep_key(match: re.Match[str]) -> str:
    """``key sep ***``; a value that is no secret (already redacted, empty, a boolean) stays."""
    value = match.group("value")
    if value == REDACTED or value.lower() in _HARMLESS_VALUES:
        return match.group(0)
    return f"{match.group('key')}{match.group('sep')}{REDACTED}"


def redact(text: str, *, env: Mapping[str, str] | None = None) -> str:
    """``text`` with anything that looks like a credential replaced by ``***``: the values of the
    secret-named variables of ``env`` (default: this process's environment) wherever they appear,
    known token shapes, ``NAME=value`` / ``"hub_token": value`` / ``password: value``, Bearer tokens,
    the password of a URL and PEM private keys."""
    return _redact(text, _values_pattern(secret_values(env)))


def redact_lines(lines: Iterable[str], *, env: Mapping[str, str] | None = None) -> list[str]:
    """``redact`` of each line, the environment's secret values looked up once for them all (a follower
    of a run's log redacts hundreds of lines a second; reading the environment took most of it)."""
    values = _values_pattern(secret_values(env))
    return [_redact(line, values) for line in lines]


def _redact(text: str, values: re.Pattern[str] | None) -> str:
    if not text:
        return text
    # The costlier patterns run only where their anchor word is (redact runs on every log line).
    if "PRIVATE KEY-----" in text:
        text = _PEM_BLOCK.sub(_pem, text)
        text = _PEM_HEAD_CUT.sub(f"{REDACTED}\n", text)
        text = _PEM_TAIL_CUT.sub(lambda m: f"{m.group('begin')}\n{REDACTED}", text)
    if values is not None:
        text = values.sub(REDACTED, text)
    for pattern in _PATTERNS:
        text = pattern.sub(REDACTED, text)
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{REDACTED}@", text)
    low = text.lower()
    if "bearer" in low or "basic" in low:
        text = _BEARER.sub(_keep_key, text)
    if "pass" in low or "secret" in low:
        text = _PASSWORD.sub(_keep_key, text)
    return _ASSIGN.sub(_keep_key, text)


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


__all__ = ["MIN_SECRET_VALUE_LEN", "REDACTED", "SECRET_TRAINING_ARGS", "hub_token_available",
           "is_secret_name", "recorded_env", "redact", "redact_lines", "secret_values",
           "strip_secret_args"]
