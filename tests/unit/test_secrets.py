"""core.secrets.redact: the credential forms a log or a bug report carries, and the values of the
environment's own secret variables wherever they appear; ordinary log text stays as it was."""

from __future__ import annotations

import pytest

from gaudi_gui.core.secrets import REDACTED, redact

KEY_BODY = ("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
            "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\n"
            "NMoSfm76oqFvAp8Gy0iz5sxjZmSnXyCdPEovGhLa0VzMaQ8s+CLOyS56YyCFGeJZ\n")


def test_the_environments_secret_values_are_redacted_wherever_they_appear() -> None:
    env = {"HF_TOKEN": "Zq8-not-a-known-shape-7731", "MY_DB_PASSWORD": "horse-battery", "PATH": "/usr/bin"}
    text = ("Zq8-not-a-known-shape-7731\n"                      # on a line of its own
            "connecting as admin/horse-battery to db\n"         # inside other text
            "PATH is /usr/bin\n")
    got = redact(text, env=env)
    assert "Zq8-not-a-known-shape-7731" not in got and "horse-battery" not in got
    assert got.splitlines() == [REDACTED, f"connecting as admin/{REDACTED} to db", "PATH is /usr/bin"]


def test_short_or_trivial_secret_values_do_not_blank_ordinary_text() -> None:
    env = {"SOME_TOKEN": "1", "USE_AUTH": "true", "API_KEY": "", "X_SECRET": "abc"}
    text = "step 1 of 10, loss 1.25, true or false, abc\n"
    assert redact(text, env=env) == text


def test_longest_value_first_leaves_no_piece_of_a_longer_secret() -> None:
    env = {"A_TOKEN": "abcdef12", "B_TOKEN": "abcdef12345678"}
    assert redact("x abcdef12345678 y", env=env) == f"x {REDACTED} y"


def test_bearer_tokens() -> None:
    got = redact("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl\n"
                 "curl -H 'authorization: bearer 0123456789abcdef' http://h", env={})
    assert "eyJhbGci" not in got and "0123456789abcdef" not in got
    assert "Authorization: Bearer ***" in got and "bearer ***" in got


def test_password_assignments() -> None:
    text = ("password: hunter2-is-long\n"
            "Password = Correct.Horse\n"
            '{"db_password": "pa55word!", "user": "bob"}\n'
            "passwd=letmein99\n")
    got = redact(text, env={})
    for secret in ("hunter2-is-long", "Correct.Horse", "pa55word!", "letmein99"):
        assert secret not in got, got
    assert '"user": "bob"' in got and "password: ***" in got


def test_password_inside_a_url() -> None:
    got = redact("cloning https://alice:s3cr3t-pw@git.example.com/org/repo.git\n"
                 "proxy http://u:p%40ss@10.0.0.1:3128 and https://example.com:8443/path@x", env={})
    assert "s3cr3t-pw" not in got and "p%40ss" not in got
    assert "https://alice:***@git.example.com/org/repo.git" in got
    assert "https://example.com:8443/path@x" in got  # a port, not a password


def test_pem_private_key_blocks() -> None:
    block = f"-----BEGIN RSA PRIVATE KEY-----\n{KEY_BODY}-----END RSA PRIVATE KEY-----\n"
    got = redact(f"loaded key\n{block}step 2\n", env={})
    assert "MIIEvQIBADAN" not in got and "NMoSfm76" not in got
    assert "-----BEGIN RSA PRIVATE KEY-----" in got and "-----END RSA PRIVATE KEY-----" in got
    assert got.startswith("loaded key\n") and got.endswith("step 2\n")
    # Escaped on one line (a JSON string), cut at the start (a log's last lines), cut at the end.
    one_line = redact('{"key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\n'
                      '-----END PRIVATE KEY-----\\n"}', env={})
    assert "MIIEvQIBADAN" not in one_line
    head_cut = redact(f"{KEY_BODY}-----END PRIVATE KEY-----\nstep 3\n", env={})
    assert "MIIEvQIBADAN" not in head_cut and "NMoSfm76" not in head_cut and "step 3" in head_cut
    tail_cut = redact(f"step 4\n-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY_BODY}", env={})
    assert "MIIEvQIBADAN" not in tail_cut and "NMoSfm76" not in tail_cut and "step 4" in tail_cut


def test_the_existing_forms_and_ordinary_text() -> None:
    got = redact("HF_TOKEN=abc123xyz --hub_token tok999 \"hub_token\": \"tok998\"", env={})
    assert "abc123xyz" not in got and "tok999" not in got and "tok998" not in got
    plain = ("max_new_tokens 40\nToken indices sequence length is longer than the specified maximum\n"
             "{'loss': '6.209', 'grad_norm': '1.5'}\nsee https://huggingface.co/docs for more\n"
             "sha 0123456789abcdef0123456789abcdef01234567\n")
    assert redact(plain, env={}) == plain


def test_the_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "w4ndb-value-from-env")
    assert redact("key w4ndb-value-from-env used") == f"key {REDACTED} used"
