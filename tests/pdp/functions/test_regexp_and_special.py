import time

import pytest

from pdp.errors import Indeterminate
from pdp.functions.xsd_regex import RegexSyntaxError, compile_xsd_regex
from tests.pdp.functions.helpers import call, v


@pytest.mark.parametrize("pattern,value,expected", [
    ("ab", "xxabyy", True),             # a match anywhere, not the whole string
    ("^ab", "xxab", False),
    ("^ab$", "ab", True),
    ("^ab$", "ab\n", False),            # $ only at the very end
    ("a.c", "a\nc", False),
    ("a.c", "abc", True),
    (r"^\d{3}-\d{4}$", "555-1234", True),
    (r"\s", "a\u00a0b", False),         # only XML whitespace
    (r"\s", "a\tb", True),
    (r"^[a-z-[aeiou]]+$", "bcd", True),
    (r"^[a-z-[aeiou]]+$", "bad", False),
    (r"^\p{Lu}\p{Ll}+$", "Émile", True),
    (r"^\p{IsBasicLatin}+$", "plain", True),
    (r"^\p{IsBasicLatin}+$", "café", False),
    (r"^\i\c*$", "xs:name-1", True),
    (r"^\i\c*$", "1name", False),
    (r"^[a-z]+(\.[a-z]+)*$", "www.example.com", True),   # nested repetition is fine
    (r"^[a-z]+(\.[a-z]+)*$", "www..com", False),
    (r"^(a|b)*c?$", "", True),
    (r"^$", "", True),
    (r"^$", "x", False),
    (r"x?", "", True),
    (r"a|^b", "cb", False),
    (r"a|^b", "bc", True),
    (r"(^a|b)$", "ca", False),
    (r"(^a|b)$", "cb", True),
    (r"^(ab){2}$", "abab", True),
    (r"^(ab){2,3}$", "ababababab", False),
    (r"^a{0,2}b$", "aab", True),
    (r"^(a{2,})$", "a", False),
    (r"[\-+]", "x+y", True),
    (r"^[^a-c]$", "d", True),
    (r"^[\d.]+$", "1.2.3", True),
    (r"^a{2,3}$", "aaaa", False),
    (r"^a+?$", "aaa", True),
    (r"\$", "cost $5", True),
    (r"^[^\]]+$", "abc", True),
])
def test_string_regexp_match(pattern, value, expected):
    assert call("string-regexp-match", pattern, value) is expected


@pytest.mark.parametrize("pattern", ["(", "a**", "(?i)abc", r"\b", "[z-a]", "[]", r"\p{Nope}",
                                     r"(a)\1", r"x{1,99999}", "a)", "^*", "[a", "{2}"])
def test_bad_or_dangerous_patterns_are_indeterminate(pattern):
    with pytest.raises(Indeterminate) as info:
        call("string-regexp-match", pattern, "aaaa")
    assert "string-regexp-match" in info.value.message


def test_pattern_size_is_bounded():
    with pytest.raises(RegexSyntaxError):
        compile_xsd_regex("a" * 5000)
    with pytest.raises(RegexSyntaxError, match="too large"):
        compile_xsd_regex("((a{1000}){1000}){1000}")


def test_compiled_patterns_are_cached():
    assert compile_xsd_regex("^cache-me$") is compile_xsd_regex("^cache-me$")


@pytest.mark.parametrize("pattern", ["(a|a)+b", "(a+)+b", "(a*b*)*c", "(a|aa)+$x",
                                     "^(\\w+\\s?)*$"])
def test_catastrophic_patterns_run_in_linear_time(pattern):
    # Each of these takes exponential time in a backtracking engine (seconds at 25 chars).
    subject = "a" * 5000 + "!"
    started = time.perf_counter()
    assert call("string-regexp-match", pattern, subject) is False
    assert time.perf_counter() - started < 1.0


def test_regexp_match_on_other_types_uses_lexical_form():
    assert call("anyURI-regexp-match", r"^http://medico\.com/", "http://medico.com/record")
    assert call("ipAddress-regexp-match", r"^122\.45\.38\.245/255\.255\.255\.64:8080$",
                v("ipAddress", "122.45.38.245/255.255.255.64:8080"))
    assert call("dnsName-regexp-match", r"\.host\.name", v("dnsName", "some.host.name:147-874"))
    assert call("rfc822Name-regexp-match", r"@MEDICO\.COM$", v("rfc822Name", "j@MEDICO.COM"))
    assert call("x500Name-regexp-match", r"o=Medi Corporation",
                v("x500Name", "cn=Julius Hibbert, o=Medi Corporation, c=US"))


def test_x500_name_match_is_a_terminal_rdn_sequence():
    full = v("x500Name", "cn=John Smith, o=Medi Corporation, c=US")
    assert call("x500Name-match", v("x500Name", "o=Medi Corporation, c=US"), full) is True
    assert call("x500Name-match", v("x500Name", "O=medi corporation,C=us"), full) is True
    assert call("x500Name-match", full, full) is True
    assert call("x500Name-match", v("x500Name", "cn=John Smith, o=Medi Corporation"),
                full) is False
    assert call("x500Name-match", v("x500Name", "c=UK"), full) is False
    assert call("x500Name-match", full, v("x500Name", "c=US")) is False


@pytest.mark.parametrize("pattern,name,expected", [
    ("Anderson@sun.com", "Anderson@SUN.COM", True),
    ("Anderson@sun.com", "anderson@sun.com", False),    # local part is case-sensitive
    ("sun.com", "Baxter@SUN.COM", True),
    ("sun.com", "Baxter@east.sun.com", False),
    (".sun.com", "Baxter@east.sun.com", True),
    (".sun.com", "Baxter@sun.com", False),
    (".east.sun.com", "x@WEST.EAST.SUN.COM", True),
    ("SUN.COM", "x@sun.com", True),
])
def test_rfc822_name_match(pattern, name, expected):
    assert call("rfc822Name-match", pattern, v("rfc822Name", name)) is expected


def test_rfc822_name_match_with_bad_mailbox_pattern():
    with pytest.raises(Indeterminate, match="rfc822Name-match"):
        call("rfc822Name-match", "@", v("rfc822Name", "a@b.c"))


def test_exploding_dfa_is_stopped_by_the_work_budget(monkeypatch):
    from pdp.functions import xsd_regex
    monkeypatch.setattr(xsd_regex, "MAX_SEARCH_WORK", 20_000)
    import random
    rng = random.Random(7)
    subject = "".join(rng.choice("ab") for _ in range(4000))  # aperiodic: new DFA states
    with pytest.raises(Indeterminate, match="too complex"):
        call("string-regexp-match", "(a|b)*a(a|b){40}c", subject)


def test_subject_length_is_bounded():
    from pdp.functions.regexp import MAX_SUBJECT_CHARS
    with pytest.raises(Indeterminate, match="longer than"):
        call("string-regexp-match", "a", "b" * (MAX_SUBJECT_CHARS + 1))
