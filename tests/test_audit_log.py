"""The audit log's appends (hami_jupyter.audit): each costs what an empty log's does (issue 39, item 4).

Every append counted the whole log's lines for its head under the writers'
lock: a log grown to 2.66 MB by one user's requests made each of the next
appends read it all, while every other writer waited. The head, when it
names the log's last line, says the count; only a head that does not match
is recounted. The chain and the head stay what ``audit verify`` checks.
"""

import json

import pytest

from hami_jupyter import audit


def _append(path, n, start=0):
    for i in range(start, start + n):
        with audit.AuditLog(path) as log:
            log.append(audit.make_record("alice", path, None, None, None, {"i": i}, action="test"))


def _head(path):
    return json.loads(audit.head_path(path).read_text())


def test_an_append_reads_no_more_than_the_logs_end(tmp_path, monkeypatch):
    path = tmp_path / "audit.log"
    _append(path, 3)  # the first append has no head yet: counted (an empty log)

    def whole_log(*_):
        raise AssertionError("the whole log was read to count its lines")

    monkeypatch.setattr(audit, "_chunks", whole_log)
    _append(path, 50, start=3)
    assert _head(path)["lines"] == 53
    assert audit.verify(path) == ([], [])
    assert [r["new"]["i"] for r in audit.read_records(path)] == list(range(53))


@pytest.mark.parametrize("damage", ["no head", "a stale head", "junk head"])
def test_a_head_that_does_not_match_the_log_is_counted_again(tmp_path, damage):
    path = tmp_path / "audit.log"
    _append(path, 4)
    head = audit.head_path(path)
    if damage == "no head":
        head.unlink()
    elif damage == "a stale head":
        head.write_text(json.dumps({"lines": 2, "last": "0" * 64}) + "\n")
    else:
        head.write_text("not json")
    _append(path, 2, start=4)
    assert _head(path)["lines"] == 6
    assert audit.verify(path) == ([], [])
