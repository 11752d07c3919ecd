"""Bearer tokens read from files named in the config (`http.token_file`, `escalate.to_v2.token_file`).

A token is the file's first line. It lives in the frozen config's `token` field (never a YAML key,
never in repr or logs); a file that cannot be read or a guessable token is a config error naming
the key and the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

from daemon.config.reader import Reader

# A bearer token shorter than this is refused: a guessable secret is no secret.
MIN_TOKEN_CHARS = 16


def read_token(r: Reader, s: Mapping, p: str, base: Path, name: Optional[str]) -> Optional[str]:
    """The token in `base / name` (None when no file is named, or on an error recorded at `p`.token_file)."""
    if name is None:
        return None
    try:
        token = (base / name).read_text(encoding="utf-8").splitlines()[0].strip()
    except (OSError, UnicodeDecodeError, IndexError) as exc:
        why = "it is empty" if isinstance(exc, IndexError) else getattr(exc, "strerror", None) or exc
        r.error(s, "token_file", p, f"cannot read {base / name}: {why}")
        return None
    if len(token) < MIN_TOKEN_CHARS:
        r.error(s, "token_file", p, f"the token in {base / name} has {len(token)} characters; "
                f"use at least {MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 32`)")
        return None
    return token
