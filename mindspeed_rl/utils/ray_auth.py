"""The Ray cluster's authentication token: where this process finds it, and what to say when a
cluster refuses it.

Ray 2.60 (``ray._private.authentication``): a cluster runs with token authentication when
``RAY_AUTH_MODE=token`` is set where it starts, or when that variable is unset and a token is
available (``ray start --head`` then switches it on; a local ``ray.init()`` always does and writes
``~/.ray/auth_token`` first). Every process that talks to the cluster must send that token: Ray
reads it from ``RAY_AUTH_TOKEN`` (the token itself), ``RAY_AUTH_TOKEN_PATH`` (a file) or
``~/.ray/auth_token``. A driver sends it only when its own mode is token: Ray switches that on by
itself for ``ray.init(address="auto")`` when a token is available, never for an explicit address
(argument or ``RAY_ADDRESS``), and a client that sends none or a wrong one is refused as
``InvalidAuthToken`` (``ray.init`` raises ConnectionError after its GCS connect timeout).

``examples/ray_launch.sh`` keeps token authentication on: it sets ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN_PATH`` for the head, the workers, its wait for nodes and the driver
(``python -m mindspeed_rl.utils.ray_auth token-file --create`` makes the head's token file).

No import of the package and no import of ray here: the launcher calls it before Ray starts.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
TOKEN_BYTES = 32  # what `ray get-auth-token --generate` makes: 256 bits, hex


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenSource:
    """Where this process's Ray token comes from."""

    variable: str
    """``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``HOME`` (Ray's default file)."""
    path: Path | None
    """The token file; None when the token is in ``RAY_AUTH_TOKEN`` itself."""

    def describe(self) -> str:
        if self.path is None:
            return f"the token in ${self.variable}"
        if self.variable == TOKEN_PATH_ENV:
            return f"the token file {self.path} (${TOKEN_PATH_ENV})"
        return f"the token file {self.path} (Ray's default)"


def default_token_path(env: Mapping[str, str]) -> Path:
    """Ray's default token file, ``~/.ray/auth_token``."""
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".ray" / "auth_token"


def token_file(env: Mapping[str, str]) -> Path:
    """The file the token lives in for this environment: ``RAY_AUTH_TOKEN_PATH`` or the default."""
    explicit = env.get(TOKEN_PATH_ENV, "")
    return Path(explicit).expanduser() if explicit else default_token_path(env)


def token_source(env: Mapping[str, str]) -> TokenSource | None:
    """The token this process would send, or None when it has none."""
    if env.get(TOKEN_ENV, "").strip():
        return TokenSource(variable=TOKEN_ENV, path=None)
    path = token_file(env)
    if path.is_file() and path.read_text().strip():
        return TokenSource(variable=TOKEN_PATH_ENV if env.get(TOKEN_PATH_ENV) else "HOME", path=path)
    return None


def refused_advice(address: str, env: Mapping[str, str]) -> str:
    """What to tell a user whose driver could not join ``address``."""
    source = token_source(env)
    if env.get(MODE_ENV, "").lower() == "token" and source is not None:
        sent = f"it sent {source.describe()}"
    elif source is not None:
        sent = f"it sent no token ({MODE_ENV} is not 'token' although {source.describe()} exists)"
    else:
        sent = "it has no token"
    return (
        f"could not join the Ray cluster at {address}; if Ray logged 'InvalidAuthToken' above, the "
        f"cluster uses token authentication and refused this driver ({sent}). Give it the cluster's "
        f"token: {MODE_ENV}=token and {TOKEN_PATH_ENV}=<a copy of the head's token file> (Ray's "
        f"default on the head is ~/.ray/auth_token), or {TOKEN_ENV}=<the token>; "
        "examples/ray_launch.sh sets both for every process it starts"
    )


def create_token_file(path: Path) -> bool:
    """Write a new random token to ``path`` (owner-only, 0600) unless one is there; True if made.

    Ray's own ``ray get-auth-token --generate`` leaves the file readable by every local user; the
    token is the cluster's only lock, so it is created here with no group or other bits."""
    if path.is_file() and path.read_text().strip():
        return False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_hex(TOKEN_BYTES))
    os.chmod(path, 0o600)  # O_CREAT's mode does not apply to a file that already existed (empty)
    return True


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """``token-file [--create]``: print this environment's token file (``--create``: make it if
    missing); exit 2 with the fix when there is no token to use."""
    parser = argparse.ArgumentParser(prog="python -m mindspeed_rl.utils.ray_auth")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("token-file", help="print the Ray token file of this environment")
    cmd.add_argument("--create", action="store_true", help="write a new token there when none exists")
    args = parser.parse_args(argv)
    env = os.environ if env is None else env
    path = token_file(env)
    if args.create:
        if create_token_file(path):
            print(f"ray_auth: wrote a new cluster token to {path} (mode 0600)", file=sys.stderr)
    elif token_source(env) is None:
        print(
            f"error: no Ray token here: {path} does not exist and ${TOKEN_ENV} is empty. Copy the head "
            f"node's token file to {path} (mode 0600), or point {TOKEN_PATH_ENV} at a copy of it on "
            "a shared file system",
            file=sys.stderr,
        )
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
