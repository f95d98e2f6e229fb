"""The Serve app's bearer token: where the driver finds it (or makes it).

The token never enters the Serve settings (Ray keeps a deployment's arguments in its controller and can show
them): the driver hands the replicas its SHA-256 only, and a replica compares the SHA-256 of the token a
request presents in constant time (`routes.authorized`). Order of sources: ``--token-file PATH`` (or
``token_file`` in a Serve config), else the environment variable ``CAPT_SERVE_TOKEN``, else a new random
token written to a file only its owner can read (mode 600) below a private temporary folder, whose path the
start-up line prints.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from pipelines.serving.source import ServeError

TOKEN_ENV = "CAPT_SERVE_TOKEN"
"""Environment variable that may hold the bearer token itself."""
MIN_TOKEN_CHARS = 16
"""Shortest token accepted from a file or the environment (a generated one has 43 characters)."""


@dataclass(frozen=True)
class Token:
    """A bearer token the driver found or made, and where (for the start-up line)."""

    sha256: str
    """SHA-256 (hex) of the token: all that the replicas receive."""
    where: str
    """Where the token is, in words ("in /tmp/.../serve-8000.token (mode 600, generated now)")."""
    generated: Path | None = None
    """The file of a token generated for this start: removed when serve stops (`forget`)."""

    def forget(self) -> None:
        """Remove the generated token's file (a given token's file or variable is the user's, left alone)."""
        if self.generated is not None:
            self.generated.unlink(missing_ok=True)


def digest(token: str) -> str:
    """SHA-256 (hex) of a token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def find_token(token_file: str | None, generated_dir: Path, port: int) -> Token:
    """The token from `token_file`, else from CAPT_SERVE_TOKEN, else a new random one in
    ``generated_dir/serve-<port>.token``, created mode 600 (a new token every start)."""
    if given := given_token(token_file):
        return given
    path = generated_dir / f"serve-{port}.token"
    path.unlink(missing_ok=True)  # O_EXCL below refuses a file or link planted meanwhile
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    token = secrets.token_urlsafe(32)
    with os.fdopen(handle, "w", encoding="utf-8") as sink:
        sink.write(token + "\n")
    return Token(digest(token), f"in {path} (mode 600, generated now)", generated=path)


def given_token(token_file: str | None) -> Token | None:
    """The token of `token_file`, else of CAPT_SERVE_TOKEN; None when neither is given."""
    if token_file:
        path = Path(token_file).expanduser()
        try:
            text = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise ServeError(f"--token-file {token_file!r}: cannot read it ({err}); give a readable text file "
                             "holding the token, or leave the option out to generate one.") from err
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ServeError(f"--token-file {token_file!r} can be read or written by other users (mode {mode:o}): "
                             f"anyone on this machine could use the token. Run chmod 600 {path}, then start again.")
        return Token(digest(_checked(text, f"--token-file {token_file!r}")), f"in {path}")
    if os.environ.get(TOKEN_ENV):
        return Token(digest(_checked(os.environ[TOKEN_ENV].strip(), TOKEN_ENV)), f"in ${TOKEN_ENV}")
    return None


def _checked(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ServeError(f"{where}: the bearer token must be at least {MIN_TOKEN_CHARS} characters without "
                         f"spaces (given {len(token)} characters); e.g. python -c 'import secrets; "
                         "print(secrets.token_urlsafe(32))'.")
    return token
