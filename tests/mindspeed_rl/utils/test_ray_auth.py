"""ray_auth: where a process finds the Ray cluster's token, the head's token file, the advice."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from mindspeed_rl.utils import ray_auth


def test_token_comes_from_the_variable_then_the_path_then_rays_default(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert ray_auth.token_source({"HOME": str(home)}) is None
    default = home / ".ray" / "auth_token"
    default.parent.mkdir(parents=True)
    default.write_text("a" * 64)
    assert ray_auth.token_source({"HOME": str(home)}) == ray_auth.TokenSource(variable="HOME", path=default)
    own = tmp_path / "cluster_token"
    own.write_text("b" * 64)
    env = {"HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(own)}
    assert ray_auth.token_source(env) == ray_auth.TokenSource(variable="RAY_AUTH_TOKEN_PATH", path=own)
    assert ray_auth.token_source({**env, "RAY_AUTH_TOKEN": "c" * 64}) == ray_auth.TokenSource(
        variable="RAY_AUTH_TOKEN", path=None
    )
    # RAY_AUTH_TOKEN_PATH names the file used: when it is empty there is no token, default or not.
    own.write_text("")
    assert ray_auth.token_source(env) is None


def test_the_heads_token_file_is_owner_only_and_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "home" / ".ray" / "auth_token"
    assert ray_auth.create_token_file(path)
    token = path.read_text()
    assert len(token) == 64 and int(token, 16) >= 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not ray_auth.create_token_file(path) and path.read_text() == token


def test_token_file_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {"HOME": str(tmp_path)}
    assert ray_auth.main(["token-file"], env) == 2
    err = capsys.readouterr().err
    assert "Copy the head node's token file" in err and "RAY_AUTH_TOKEN_PATH" in err
    assert ray_auth.main(["token-file", "--create"], env) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(tmp_path / ".ray" / "auth_token") and Path(out).is_file()
    assert ray_auth.main(["token-file"], env) == 0


def test_refusal_advice_says_what_was_sent_and_how_to_fix_it(tmp_path: Path) -> None:
    none = ray_auth.refused_advice("10.0.0.1:6379", {"HOME": str(tmp_path)})
    assert "10.0.0.1:6379" in none and "it has no token" in none
    assert "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH=<a copy of the head's token file>" in none
    token = tmp_path / "t"
    token.write_text("x" * 64)
    unsent = ray_auth.refused_advice("h:1", {"HOME": str(tmp_path), "RAY_AUTH_TOKEN_PATH": str(token)})
    assert "it sent no token (RAY_AUTH_MODE is not 'token'" in unsent
    sent = ray_auth.refused_advice(
        "h:1", {"HOME": str(tmp_path), "RAY_AUTH_TOKEN_PATH": str(token), "RAY_AUTH_MODE": "token"}
    )
    assert f"it sent the token file {token} ($RAY_AUTH_TOKEN_PATH)" in sent
