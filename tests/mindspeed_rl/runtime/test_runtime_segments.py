import pytest

from mindspeed_rl.runtime.segments import (
    TokenSegment,
    check_aligned,
    extend,
    may_split,
    oldest_token_lag,
    oldest_version,
    token_versions,
)


def test_segments_accumulate_and_merge_same_version() -> None:
    s = extend((), 3, 4, max_split=3)
    s = extend(s, 3, 2, max_split=3)  # same version: the last segment grows
    s = extend(s, 5, 1, max_split=3)
    assert s == (TokenSegment(version=3, num_tokens=6), TokenSegment(version=5, num_tokens=1))
    assert token_versions(s) == (3, 3, 3, 3, 3, 3, 5)
    check_aligned(s, 7)
    with pytest.raises(ValueError, match="cover 7 tokens"):
        check_aligned(s, 8)


def test_max_split_bounds_segments() -> None:
    s = extend(extend((), 0, 2, max_split=2), 1, 2, max_split=2)
    assert not may_split(s, max_split=2)
    with pytest.raises(ValueError, match="partial_rollout_max_split=2"):
        extend(s, 2, 1, max_split=2)
    one = extend((), 0, 5, max_split=1)
    with pytest.raises(ValueError, match="partial_rollout_max_split=1"):
        extend(one, 1, 1, max_split=1)  # N = 1: one version per response, as today


def test_versions_never_go_back() -> None:
    with pytest.raises(ValueError, match="newer snapshots"):
        extend(extend((), 4, 1, max_split=3), 2, 1, max_split=3)


def test_lag_counts_from_oldest_token() -> None:
    s = extend(extend((), 2, 3, max_split=3), 4, 3, max_split=3)
    assert oldest_version(s, default=9) == 2
    assert oldest_token_lag(5, s, default=9) == 3
    assert oldest_token_lag(5, (), default=4) == 1  # no tokens yet: the start version


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="num_tokens >= 1"):
        TokenSegment(version=0, num_tokens=0)
    with pytest.raises(ValueError, match="must be >= 1"):
        extend((), 0, 1, max_split=0)
