"""The error-to-status table finds an exception's status by its class hierarchy (most specific
class first, as Flask finds handlers), so the order of its entries does not matter."""
from __future__ import annotations

from common.http.errors import status_for
from common.numbers import NumberError
from pdp import PolicyNotFoundError
from pep.core.errors import (
    AccessDenied,
    Conflict,
    InputTooLarge,
    InvalidInput,
    MalformedRequest,
    NoResult,
    NotPermitted,
    Refusal,
    Unavailable,
)
from pep.handles.one_window import WindowConflict
from pep.http.errors import status_of
from pep.streams.records import BatchTooLarge, RecordError


class _Base(Exception):
    pass


class _Sub(_Base):
    pass


class _SubSub(_Sub):
    pass


def test_a_subclass_listed_after_its_base_keeps_its_own_status():
    table = [(_Base, 400), (_Sub, 413)]  # first-match-in-order would give _Sub 400
    assert status_for(_Sub("x"), table) == 413
    assert status_for(_SubSub("x"), table) == 413  # the nearest mapped ancestor
    assert status_for(_Base("x"), table) == 400
    assert status_for(_Sub("x"), dict(table)) == 413
    assert status_for(_Sub("x"), list(reversed(table))) == 413


def test_an_unmapped_exception_has_no_status():
    assert status_for(KeyError("x"), [(_Base, 400)]) is None
    assert status_of(Refusal("a bare refusal")) is None  # no kind: the edge answers 500
    assert status_of(RuntimeError("bug")) is None


def test_the_gateway_table():
    assert status_of(InvalidInput("x")) == 400
    assert status_of(MalformedRequest("x")) == 400
    assert status_of(InputTooLarge("x")) == 413
    assert status_of(NotPermitted("x")) == 403
    assert status_of(AccessDenied("x")) == 403
    assert status_of(WindowConflict("h1", "x")) == 409  # a Conflict of the handles
    assert status_of(Conflict("x")) == 409
    assert status_of(NoResult("x")) == 422  # an Unprocessable
    assert status_of(Unavailable("x", retry_after=2)) == 503
    assert status_of(NumberError("query parameter 'after'", "x")) == 400
    assert status_of(PolicyNotFoundError("p")) == 404


def test_a_batch_over_the_limits_is_413_though_also_a_record_error():
    exc = BatchTooLarge("more than 3 lines in one batch")
    assert isinstance(exc, RecordError) and isinstance(exc, InvalidInput)
    assert status_of(exc) == 413
    assert status_of(RecordError("bad field", line=2, field="x")) == 400
