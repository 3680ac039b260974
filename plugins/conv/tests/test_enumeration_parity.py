"""The conv kernel space per arch equals the recorded one (data/enumeration.json, written by
enumeration_record.py before CK's tile tables moved out of the code into data files): moving
facts between files must not add, drop or rename a key."""
import json
from pathlib import Path

import pytest

from enumeration_record import ARCHS, record

RECORD = json.loads((Path(__file__).parent / "data" / "enumeration.json").read_text())


@pytest.fixture(scope="module")
def current():
    from ck_core.plugins import get_manager

    have = set(get_manager().archs)
    missing = [a for a in ARCHS if a not in have]
    if missing:
        pytest.skip(f"arch plugins not installed: {missing}")
    return record()


@pytest.mark.parametrize("arch", ARCHS)
def test_space_equals_the_record(current, arch):
    assert current[arch] == RECORD[arch]
