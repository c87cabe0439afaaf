import pytest

from pdp.errors import Indeterminate
from tests.pdp.functions.helpers import call


def const(value):
    return lambda: value


def boom():
    raise Indeterminate("missing attribute")


class Counter:
    def __init__(self, value):
        self.value, self.calls = value, 0

    def __call__(self):
        self.calls += 1
        return self.value


def test_or_true_wins_over_indeterminate():
    assert call("or", boom, const(True)) is True
    assert call("or", const(False), const(False)) is False
    assert call("or") is False
    with pytest.raises(Indeterminate, match="missing"):
        call("or", const(False), boom)


def test_or_short_circuits():
    later = Counter(False)
    assert call("or", const(True), later) is True
    assert later.calls == 0


def test_and_false_wins_over_indeterminate():
    assert call("and", boom, const(False)) is False
    assert call("and", const(True), const(True)) is True
    assert call("and") is True
    with pytest.raises(Indeterminate):
        call("and", const(True), boom)
    later = Counter(True)
    assert call("and", const(False), later) is False and later.calls == 0


def test_n_of():
    assert call("n-of", const(0)) is True
    assert call("n-of", const(2), const(True), const(False), const(True)) is True
    assert call("n-of", const(2), const(True), const(False), const(False)) is False
    # Indeterminate argument, but two Trues already decide.
    assert call("n-of", const(2), const(True), boom, const(True)) is True
    # Indeterminate could have made the difference.
    with pytest.raises(Indeterminate):
        call("n-of", const(2), const(True), boom, const(False))
    # Cannot be reached even if the Indeterminate were True: False.
    assert call("n-of", const(3), const(False), boom, const(True)) is False


def test_n_of_stops_early():
    later = Counter(True)
    assert call("n-of", const(1), const(True), later) is True
    assert later.calls == 0
    assert call("n-of", const(2), const(False), const(False), later) is False
    assert later.calls == 0


def test_n_of_errors():
    with pytest.raises(Indeterminate, match="n-of"):
        call("n-of", const(3), const(True))
    with pytest.raises(Indeterminate):
        call("n-of", boom, const(True))


def test_not():
    assert call("not", True) is False and call("not", False) is True
