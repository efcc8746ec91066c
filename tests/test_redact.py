"""``klwatch.redact``, the one redaction helper every face uses (issue 13): what of a URL or a SOURCE
may be shown, and how free text (an exception's message, a report's field) is cleaned of the
credentials a scan was given, on the command line or in the environment."""

from __future__ import annotations

import base64
from urllib.parse import quote, urlsplit

import pytest

from klwatch.redact import (MASK, env_secrets, masker, redact_spec, redact_url, redactor, scrub, spec_secrets,
                            without_userinfo)


@pytest.mark.parametrize("url, shown, secret", [
    ("https://hooks.slack.com/services/T0AAA1111/B0BBB2222/abcdefghijklmnopqrstuvwx",
     "https://hooks.slack.com/services/***", "abcdefghijklmnopqrstuvwx"),
    ("https://discord.com/api/webhooks/123456789012345678/Zx9_token-Value", "https://discord.com/api/webhooks/***",
     "Zx9_token-Value"),
    ("https://alice:s3cretpw@alerts.example.com/notify?token=qwerty123#frag",
     "https://***@alerts.example.com/notify?***#***", "s3cretpw"),
    ("https://alerts.example.com/hook/9f86d081884c7d659a2feaa0c55ad015", "https://alerts.example.com/hook/***",
     "9f86d081884c7d659a2feaa0c55ad015"),
])
def test_redacted_url_hides_tokens_userinfo_and_query(url, shown, secret):
    assert redact_url(url) == shown
    assert secret not in redact_url(url)
    message = f"POST {url} failed; path {urlsplit(url).path}; query {urlsplit(url).query}"
    assert secret not in scrub(message, [url])


def test_plain_loopback_url_is_shown_as_is():
    assert redact_url("http://127.0.0.1:8080/hook") == "http://127.0.0.1:8080/hook"


@pytest.mark.parametrize("spec, shown", [
    ("mlflow://user:pw1234@127.0.0.1:5000/exp#grpo-*", "mlflow://***@127.0.0.1:5000/exp#grpo-*"),
    ("mlflow+https://u:p@ss#w0rd@mlflow.example.com#run", "mlflow+https://***@mlflow.example.com#run"),
    ("mlflow://h:5000/exp?token=abcdef#x", "mlflow://h:5000/exp?***#x"),
    ("runs/grpo#user:x@y", "runs/grpo#user:x@y"),  # a local path is shown as given
    ("wandb://team/rl/run-1", "wandb://team/rl/run-1"),
])
def test_a_spec_is_shown_without_userinfo_or_query_values_and_keeps_its_pattern(spec, shown):
    assert redact_spec(spec) == shown


def test_a_specs_secrets_are_its_userinfo_password_basic_header_and_query_values():
    got = spec_secrets("mlflow://bob:p%40ss-word@h:1/exp?token=t0k3n-value&x=1#pat")
    basic = base64.b64encode(b"bob:p@ss-word").decode()
    assert set(got) == {"bob:p%40ss-word", "bob:p@ss-word", "p%40ss-word", "p@ss-word", basic, "t0k3n-value"}
    assert got == sorted(got, key=len, reverse=True)  # the longest masked first, never a piece of it left
    assert spec_secrets("runs/user:secret@x") == []
    assert "h:1#a" in spec_secrets("mlflow://h:1#a@b:c")  # an "@" in a pattern: masked rather than risk a password


def test_the_redactor_masks_a_scans_credentials_in_any_text(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "env-token-123")
    clean = redactor(["mlflow://bob:hunter2-pw@h:1#x", "runs/"])
    text = ("mlflow://bob:hunter2-pw@h:1#x: no run; said hunter2-pw; header "
            + base64.b64encode(b"bob:hunter2-pw").decode() + "; Bearer env-token-123; http://eve:other@x/")
    assert clean(text) == f"mlflow://{MASK}@h:1#x: no run; said {MASK}; header {MASK}; Bearer {MASK}; http://{MASK}@x/"
    assert clean("runs/grpo: fine") == "runs/grpo: fine"


def test_the_environments_basic_auth_header_is_a_secret_too(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret-pw")
    header = base64.b64encode(b"alice:s3cret-pw").decode()
    assert header in env_secrets()
    assert scrub(f"echoed Basic {header}") == f"echoed Basic {MASK}"


def test_a_link_keeps_its_query_but_loses_its_userinfo():
    assert without_userinfo("https://u:pw@dash.example.com/?page=runs") == "https://dash.example.com/?page=runs"


def test_a_secret_is_masked_in_every_form_it_may_be_echoed_in_and_nothing_else_is():
    secret = "s3cr3t-Token-0123456789"
    mask = masker([secret])
    header = base64.b64encode(f"bob:{secret}".encode()).decode()  # inside a longer base64 string
    for shown in (secret, secret.upper(), quote(secret, safe=""), base64.b64encode(secret.encode()).decode(),
                  secret[:14], secret[7:15], header):
        masked = mask(f"server said <{shown}> twice: {shown}")
        assert masked.count("***") >= 2, (shown, masked)
        assert not any(secret[i:i + 8].lower() in masked.lower() for i in range(len(secret) - 7)), masked
    assert mask("the run grpo-buggy resumed at step 40") == "the run grpo-buggy resumed at step 40"
