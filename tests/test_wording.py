import pytest

from course_lib.core.wording import ratio_phrase


def test_direction_follows_the_numbers():
    assert ratio_phrase(218.2, 13.4, less="shorter", more="longer", digits=0) == "16x shorter"
    # the review's run: freeze's longest pause 28.9 ms against 4.8 ms with defaults
    assert ratio_phrase(4.8, 28.9, less="shorter", more="longer") == "6.0x longer"
    assert ratio_phrase(2.0, 1.0) == "2.0x lower"
    assert ratio_phrase(1.0, 2.0) == "2.0x higher"


def test_ratio_is_never_below_one():
    for before, after in [(1, 3), (3, 1), (0.5, 0.2), (0.2, 0.5)]:
        factor = float(ratio_phrase(before, after).split("x")[0])
        assert factor >= 1.0


def test_equal_or_rounding_to_one_is_same():
    assert ratio_phrase(5.0, 5.0) == "unchanged"
    assert ratio_phrase(1.00, 1.04, same="about the same") == "about the same"
    assert ratio_phrase(0, 0) == "unchanged"


def test_zero_ends():
    assert ratio_phrase(3.0, 0.0, less="fewer") == "fewer, down to zero"
    assert ratio_phrase(0.0, 3.0, more="more") == "more, up from zero"


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_input_is_refused(bad):
    with pytest.raises(ValueError, match="before"):
        ratio_phrase(bad, 1.0)
    with pytest.raises(ValueError, match="after"):
        ratio_phrase(1.0, bad)


def test_bad_digits():
    with pytest.raises(ValueError, match="digits"):
        ratio_phrase(1.0, 2.0, digits=-1)
