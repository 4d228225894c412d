"""The public safety guard: the one check every public file passes before it is written.

Pure. Invariants of a document that passes:
- no key whose leaf is one of the reference's forbidden keys;
- none of the reference's forbidden texts, in keys or values;
- no absolute host path, no home-relative path, and none of the caller's
  private texts (the job root, the home directory, secret values);
- no raw content: every string is one line of at most ``MAX_STRING`` characters
  and holds no diff syntax, so neither a patch nor a log can pass.
A violation raises ``PublicSafetyError`` naming the key path; nothing is dropped silently.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from reducers.errors import PublicSafetyError

# From the reference reducer (AGENTISSUE_REAL_RESULT_FORBIDDEN_KEYS), unchanged.
FORBIDDEN_KEYS = frozenset(
    {
        "access_token", "api_key", "authorization", "codex_auth", "credential",
        "environment", "file_content", "fixed_diff", "gold_material", "local_path",
        "password", "patch_content", "problem_statement", "raw_artifact", "raw_comment",
        "raw_diff", "raw_issue_body", "raw_issue_title", "raw_log", "raw_output",
        "raw_patch", "screenshot", "session", "solution", "source_diff", "test_body",
        "test_patch", "trajectory",
    }
)
# From the reference (AGENTISSUE_REAL_RESULT_FORBIDDEN_TEXT), split so this file is not itself a hit.
FORBIDDEN_TEXTS = (
    "/" + "Users/",
    "~/.codex",
    ".codex/auth.json",
    "CODEX" + "_ACCESS_TOKEN",
    "OPENAI" + "_API_KEY",
    "ANTHROPIC" + "_API_KEY",
    "GOOGLE" + "_API_KEY",
    "raw_issue_body",
    "raw_patch",
    "trajectory.json",
)
# Text that only a patch or a log would hold.
RAW_CONTENT_TEXTS = ("diff --git", "@@ -", "--- a/", "+++ b/", "Traceback (most recent call last)")
MAX_STRING = 512

# A slash that starts a path rather than separating two names ("/app/x" yes, "Patches/x" no).
_ABSOLUTE_PATH = re.compile(r"(?<![A-Za-z0-9._@-])/[A-Za-z0-9._@+-]+")
_HOME_PATH = re.compile(r"(?<![A-Za-z0-9._-])~/")
_WINDOWS_PATH = re.compile(r"\b[A-Za-z]:\\")
# Environment variables whose values are secrets wherever they appear.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)
_MIN_SECRET_LENGTH = 6


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """Values of the secret-looking variables in ``environ``, for ``private_texts``."""
    return [
        value
        for name, value in environ.items()
        if _SECRET_NAME.search(name) and len(value) >= _MIN_SECRET_LENGTH
    ]


def _walk(value: Any, path: str) -> Iterator[tuple[str, str | None, Any]]:
    """Yield (key path, key or None, value) for every node below ``value``."""
    if isinstance(value, Mapping):
        for key, child in value.items():
            child_path = f"{path}.{key}" if path else str(key)
            yield child_path, str(key), child
            yield from _walk(child, child_path)
    elif isinstance(value, (list, tuple)):
        for index, child in enumerate(value):
            child_path = f"{path}[{index}]"
            yield child_path, None, child
            yield from _walk(child, child_path)


def _text_rule(text: str, private_texts: tuple[str, ...]) -> str | None:
    for forbidden in FORBIDDEN_TEXTS:
        if forbidden in text:
            return f"forbidden text {forbidden!r}"
    for private in private_texts:
        if private in text:
            return "private host text (job root, home directory or secret value)"
    if _ABSOLUTE_PATH.search(text) or _HOME_PATH.search(text) or _WINDOWS_PATH.search(text):
        return "absolute host path"
    for raw in RAW_CONTENT_TEXTS:
        if raw in text:
            return "raw patch or log content"
    if "\n" in text or "\r" in text or len(text) > MAX_STRING:
        return f"raw content (strings must be one line of at most {MAX_STRING} characters)"
    return None


def check_public(document: str, payload: Mapping[str, Any], *, private_texts: Iterable[str] = ()) -> None:
    """Refuse ``payload`` unless it is safe to publish as ``document``.

    Raises:
        PublicSafetyError: naming the document, the first offending key path and the rule.
    """
    privates = tuple(sorted({text for text in private_texts if text}, key=len, reverse=True))
    for key_path, key, value in _walk(payload, ""):
        if key is not None:
            if key.lower() in FORBIDDEN_KEYS:
                raise PublicSafetyError(document, key_path, f"forbidden key {key.lower()!r}")
            rule = _text_rule(key, privates)
            if rule:
                raise PublicSafetyError(document, key_path, f"key: {rule}")
        if isinstance(value, str):
            rule = _text_rule(value, privates)
            if rule:
                raise PublicSafetyError(document, key_path, rule)
        elif not isinstance(value, (Mapping, list, tuple, int, float, bool, type(None))):
            raise PublicSafetyError(document, key_path, f"unsupported value type {type(value).__name__}")
