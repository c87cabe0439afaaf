"""`python -m pep.delivery.grants` refuses malformed arguments as argparse does (exit 2, a usage
line and what is wrong in which argument) before it contacts any broker: never a traceback,
never a 30 s wait on a broker it cannot name, never an ACL on the wrong topics (an empty
`--prefix` would let every edge read every topic)."""
from __future__ import annotations

import pytest

from pep.delivery.grants import main

OK = ["--bootstrap", "127.0.0.1:1", "--gateway", "xsg-gw"]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("args, where, what", [
    (["--bootstrap", "", "--gateway", "g"], "argument --bootstrap", "host:port"),
    (["--bootstrap", "broker", "--gateway", "g"], "argument --bootstrap", "host:port"),
    (["--bootstrap", "h:y", "--gateway", "g"], "argument --bootstrap", "'h:y'"),
    (["--bootstrap", "h:70000", "--gateway", "g"], "argument --bootstrap", "1 to 65535"),
    (["--bootstrap", "h:\u00b2", "--gateway", "g"], "argument --bootstrap", "1 to 65535"),
    (["--bootstrap", "h:9092,", "--gateway", "g"], "argument --bootstrap", "host:port"),
    ([*OK, "--prefix", ""], "argument --prefix", "1 to 100"),
    ([*OK, "--prefix", "xsg /"], "argument --prefix", "'xsg /'"),
    (["--bootstrap", "h:1", "--gateway", ""], "argument --gateway", "a Kafka user name"),
    ([*OK, "--edge", "edge 1"], "argument --edge", "'edge 1'"),
    ([*OK, "--edge", "xsg-gw"], "argument --edge", "the gateway's user"),
    ([*OK, "--edge", "e1", "--edge", "e1"], "argument --edge", "'e1' given twice"),
    ([*OK, "--edge", "e-1", "--edge", "e.1"], "argument --edge",
     "XSG_DELIVERY_PASSWORD_E_1"),
    ([*OK, "--mechanism", "PLAIN"], "argument --mechanism", "invalid choice"),
    (["--gateway", "g"], "error:", "--bootstrap"),
])
def test_malformed_arguments_exit_2_saying_what_and_where(args, where, what, capsys):
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m pep.delivery.grants"), err
    assert where in err and what in err, err
    assert "Traceback" not in err
