"""The registry covers every function and data type that the conformance suite uses, and its
metadata is consistent enough for the policy loader to type-check calls with it."""
import re
from pathlib import Path

import pytest

from pdp import datatypes as dt
from pdp.functions import FUNCTION_PARAM, FUNCTIONS, Param, get_function, signature_error

CONFORMANCE = Path("/work/shared/conformance/xacml3")
XPATH_IDS = re.compile(r"xpath", re.IGNORECASE)


def _ids(attribute: str) -> set[str]:
    found: set[str] = set()
    pattern = re.compile(rf'{attribute}="([^"]+)"')
    for path in CONFORMANCE.rglob("*"):
        name = path.name.lower()
        if not path.is_file() or not name.endswith(".xml") or "response" in name:
            continue
        found.update(pattern.findall(path.read_text(encoding="utf-8", errors="replace")))
    return {i for i in found if not XPATH_IDS.search(i)}


@pytest.mark.skipif(not CONFORMANCE.is_dir(), reason="conformance suite not available")
def test_every_conformance_function_is_registered():
    used = _ids("FunctionId")
    assert len(used) > 150
    assert sorted(used - FUNCTIONS.keys()) == []


@pytest.mark.skipif(not CONFORMANCE.is_dir(), reason="conformance suite not available")
def test_every_conformance_datatype_is_registered():
    used = _ids("DataType")
    assert dt.DOUBLE in used
    assert sorted(used - dt.DATATYPES.keys()) == []


def test_unknown_function_is_a_key_error():
    with pytest.raises(KeyError, match="no-such"):
        get_function("urn:x:no-such")


def test_metadata_is_consistent():
    for function in FUNCTIONS.values():
        assert function.id.startswith("urn:oasis:names:tc:xacml:")
        assert callable(function.impl)
        for param in function.params:
            assert param.type is None or param.type == FUNCTION_PARAM \
                or param.type in dt.DATATYPES, function.id
        if function.return_type is not None:
            assert function.return_type in dt.DATATYPES, function.id
        if function.higher_order:
            assert function.params[0] == Param(FUNCTION_PARAM)
            assert function.arg_shape in ("one-bag", "two-bags", "any")
        assert function.min_args is not None
        assert function.accepts_arity(function.min_args)
        assert not function.lazy or function.id.rsplit(":", 1)[1] in ("and", "or", "n-of")


def test_arity_convention():
    add = get_function("urn:oasis:names:tc:xacml:1.0:function:integer-add")
    assert add.variadic and add.min_args == 2 and add.max_args is None
    assert not add.accepts_arity(1) and add.accepts_arity(5)
    bag = get_function("urn:oasis:names:tc:xacml:1.0:function:string-bag")
    assert bag.accepts_arity(0) and bag.returns_bag
    sub = get_function("urn:oasis:names:tc:xacml:1.0:function:integer-subtract")
    assert sub.max_args == 2 and not sub.accepts_arity(3)
    n_of = get_function("urn:oasis:names:tc:xacml:1.0:function:n-of")
    assert n_of.param_at(0).type == dt.INTEGER and n_of.param_at(4).type == dt.BOOLEAN


def test_signature_error_for_first_order_calls():
    sub = get_function("urn:oasis:names:tc:xacml:1.0:function:integer-subtract")
    assert signature_error(sub, [(dt.INTEGER, False), (dt.INTEGER, False)]) is None
    assert "argument 2" in signature_error(sub, [(dt.INTEGER, False), (dt.STRING, False)])
    assert "bag" in signature_error(sub, [(dt.INTEGER, True), (dt.INTEGER, False)])
    assert "takes 2" in signature_error(sub, [(dt.INTEGER, False)])
    legacy_eq = get_function("urn:oasis:names:tc:xacml:1.0:function:dayTimeDuration-equal")
    assert signature_error(legacy_eq, [(dt.DAYTIMEDURATION, False),
                                       (dt.LEGACY_DAYTIMEDURATION, False)]) is None


def test_signature_error_for_higher_order_calls():
    any_of = get_function("urn:oasis:names:tc:xacml:3.0:function:any-of")
    equal = get_function("urn:oasis:names:tc:xacml:1.0:function:string-equal")
    lower = get_function("urn:oasis:names:tc:xacml:1.0:function:string-normalize-to-lower-case")
    assert signature_error(any_of, [(dt.STRING, False), (dt.STRING, True)], equal) is None
    assert "one bag" in signature_error(any_of, [(dt.STRING, False), (dt.STRING, False)], equal)
    assert signature_error(any_of, [(dt.INTEGER, False), (dt.STRING, True)], equal)
    assert "boolean" in signature_error(any_of, [(dt.STRING, True)], lower)
    assert "<Function>" in signature_error(any_of, [(dt.STRING, True)], None)
    map_ = get_function("urn:oasis:names:tc:xacml:3.0:function:map")
    assert signature_error(map_, [(dt.STRING, True)], lower) is None
    all_of_any = get_function("urn:oasis:names:tc:xacml:1.0:function:all-of-any")
    assert signature_error(all_of_any, [(dt.STRING, True), (dt.STRING, True)], equal) is None
    assert signature_error(all_of_any, [(dt.STRING, False), (dt.STRING, True)], equal)
