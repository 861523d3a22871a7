import pytest

from mindspeed_rl.runtime.records import Sample
from mindspeed_rl.runtime.segments import TokenSegment, check_aligned, extend, token_versions


def _sample(n_tokens: int, version: int, segments: tuple[TokenSegment, ...]) -> Sample:
    return Sample(
        prompt_id="p",
        sample_index=0,
        minibatch_id=0,
        response_token_ids=tuple(range(n_tokens)),
        rollout_log_probs=(-1.0,) * n_tokens,
        reward=None,
        policy_version=version,
        gu_id=0,
        actor_id=0,
        sent_at=0.0,
        segments=segments,
    )


def test_segments_accumulate_and_merge_same_version() -> None:
    s = extend((), 3, 4, max_split=3)
    s = extend(s, 3, 2, max_split=3)  # same version: the last segment grows
    s = extend(s, 5, 1, max_split=3)
    s = extend(s, 5, 0, max_split=3)  # nothing generated: nothing recorded
    assert s == (TokenSegment(version=3, num_tokens=6), TokenSegment(version=5, num_tokens=1))
    assert token_versions(s) == (3, 3, 3, 3, 3, 3, 5)
    check_aligned(s, 7)
    with pytest.raises(ValueError, match="cover 7 tokens"):
        check_aligned(s, 8)


def test_max_split_bounds_segments() -> None:
    s = extend(extend((), 0, 2, max_split=2), 1, 2, max_split=2)
    with pytest.raises(ValueError, match="partial_rollout_max_split=2"):
        extend(s, 2, 1, max_split=2)
    one = extend((), 0, 5, max_split=1)
    with pytest.raises(ValueError, match="partial_rollout_max_split=1"):
        extend(one, 1, 1, max_split=1)  # N = 1: one version per response, as before


def test_versions_never_go_back() -> None:
    with pytest.raises(ValueError, match="newer snapshots"):
        extend(extend((), 4, 1, max_split=3), 2, 1, max_split=3)


def test_sample_versions_and_checks() -> None:
    segs = (TokenSegment(version=2, num_tokens=3), TokenSegment(version=4, num_tokens=2))
    sample = _sample(5, 2, segs)
    assert token_versions(sample.segments) == (2, 2, 2, 4, 4)
    assert sample.num_segments == 2
    plain = _sample(3, 7, ())
    assert plain.num_segments == 1
    with pytest.raises(ValueError, match="oldest token is from version 2"):
        _sample(5, 3, segs)  # policy_version must be the oldest token's
    with pytest.raises(ValueError, match="cover 5 tokens"):
        _sample(4, 2, segs)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="num_tokens >= 1"):
        TokenSegment(version=0, num_tokens=0)
    with pytest.raises(ValueError, match="must be >= 1"):
        extend((), 0, 1, max_split=0)
