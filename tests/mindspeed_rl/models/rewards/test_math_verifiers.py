import threading

import pytest

from mindspeed_rl.models.rewards import math_verifiers as mv
from mindspeed_rl.models.rewards.answer_extraction import boxed_contents, final_segment, last_boxed

R1_RIGHT = (
    "<think>\nThe area is half the base times height, 1/2.\n</think>\nSo the answer is \\boxed{\\frac{1}{2}}."
)


def test_boxed_extraction_balances_nested_braces_and_skips_unclosed_boxes():
    text = "first \\boxed{\\frac{1}{2}} then \\boxed{\\sqrt{x^{2}}} and a cut-off \\boxed{\\frac{3"
    assert boxed_contents(text) == ["\\frac{1}{2}", "\\sqrt{x^{2}}"]
    assert last_boxed(text) == "\\sqrt{x^{2}}"
    assert last_boxed("no answer here") is None


def test_final_segment_is_text_after_the_reasoning_block():
    assert final_segment("<think>a \\boxed{1}</think> b") == " b"
    assert final_segment("plain \\boxed{2}") == "plain \\boxed{2}"


@pytest.mark.parametrize("verifier", [mv.acc, mv.math_17k_acc, mv.base_acc, mv.math_verify_reward])
@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        (R1_RIGHT, "0.5", 1.0),  # \frac{1}{2} vs 0.5: equal as numbers
        ("\\boxed{2}", "3", 0.0),
        ("<think>\nx\n</think>\n\\boxed{3}", "3", 1.0),
        ("", "3", 0.0),
        ("<think>\nI am not sure.\n</think>\nNo idea.", "3", 0.0),
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),  # symbolic equality
        ("\\boxed{2}", "", 0.0),  # no gold answer: never a reward
    ],
)
def test_all_math_verifiers_on_common_cases(verifier, response, label, expected):
    assert verifier(response, label) == expected


def test_acc_needs_a_box_after_the_reasoning_block():
    assert mv.acc("<think>\nIt is \\boxed{3}\n</think>\nthe answer is 3", "3") == 0.0
    assert mv.acc("the answer is 3", "3") == 0.0  # no box at all


def test_math_verify_reward_and_base_acc_accept_unboxed_answers():
    assert mv.math_verify_reward("The answer is $\\frac{1}{2}$", "1/2") == 1.0
    assert mv.base_acc("so we get 1/2", "0.5") == 1.0
    assert mv.math_verify_reward("<think>\n$1/2$\n</think>\nThe answer is 5.", "1/2") == 0.0


def test_math_17k_acc_reads_the_gold_answer_from_a_worked_solution_label():
    label = "Adding gives $2+3=5$, so the total is \\boxed{5}."
    assert mv.math_17k_acc("\\boxed{5}", label) == 1.0
    assert mv.math_17k_acc("\\boxed{2}", label) == 0.0


def test_overlong_answers_score_zero_without_parsing():
    huge = "\\boxed{" + "1+" * mv.MAX_ANSWER_CHARS + "1}"
    assert mv.acc(huge, str(mv.MAX_ANSWER_CHARS + 1)) == 0.0


def test_verifiers_work_outside_the_main_thread():
    # math-verify's signal.alarm timeout raises off the main thread unless disabled; Ray actors
    # may call reward functions from worker threads.
    results: list[float] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.extend(
                [
                    mv.acc(R1_RIGHT, "0.5"),
                    mv.math_verify_reward("it is 1/2", "0.5"),
                    mv.acc("\\boxed{2}", "3"),
                ]
            )
        except BaseException as err:  # surfaced through the assertion below
            errors.append(err)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert not errors, errors
    assert results == [1.0, 1.0, 0.0]
