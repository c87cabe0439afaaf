"""The owners' hash keys on disk (pep/runtime/privacy/mask_keys.py): made once, kept, private."""
from __future__ import annotations

import hashlib
import os
import stat
import threading

import pytest

from pep.runtime.privacy.mask_keys import KEY_BYTES, MaskKeys


def test_one_key_per_owner_made_once_kept_and_private(tmp_path):
    directory = tmp_path / "mask-keys"
    stores = [MaskKeys(directory) for _ in range(8)]  # as two processes racing would
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda s=s: got.append(s.key_for("nea"))) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 8 and len(set(got)) == 1 and len(got[0]) == KEY_BYTES
    assert MaskKeys(directory).key_for("nea") == got[0]  # after a restart: the same key
    assert MaskKeys(directory).key_for("lta") != got[0]
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    names = sorted(p.name for p in directory.iterdir())
    assert names == sorted(hashlib.sha256(o.encode()).hexdigest() + ".key"
                           for o in ("nea", "lta"))  # no owner's name, nothing left over
    for p in directory.iterdir():
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600


def test_a_damaged_key_is_refused_without_naming_the_file(tmp_path):
    keys = MaskKeys(tmp_path)
    keys.path_for("nea").write_bytes(b"short")
    with pytest.raises(RuntimeError, match="damaged") as caught:
        keys.key_for("nea")
    assert str(tmp_path) not in str(caught.value)
