"""The broadcasting consumer's local offset file (client.consumer.offset_store): written atomically and read
back, a damaged file is a named error naming it, one holder at a time (issue 16 item 14); a
default id steps aside to its spares while it is held (issue 34 item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client import OffsetStoreError, OffsetStoreLockedError
from client.consumer.offset_store import LocalOffsetStore
from client.types import MessageQueue

MQ = MessageQueue("orders", "a", 3)


def test_progress_is_written_and_read_back(tmp_path: Path) -> None:
    store = LocalOffsetStore(tmp_path, "g/1", "host@DEFAULT")
    store.open()
    assert store.get(MQ) == -1 and store.changed() is None
    store.offsets[MQ] = 17
    changed = store.changed()
    assert changed == {MQ: 17}
    store.write(changed)
    assert store.changed() is None
    store.close()
    assert store.path == tmp_path / "host@DEFAULT" / "g%2F1.json"  # a group name is no path
    assert not list(store.path.parent.glob("*.tmp"))
    again = LocalOffsetStore(tmp_path, "g/1", "host@DEFAULT")
    again.open()
    assert again.get(MQ) == 17
    again.close()


def test_a_damaged_file_is_a_named_error(tmp_path: Path) -> None:
    store = LocalOffsetStore(tmp_path, "g", "c")
    store.path.parent.mkdir(parents=True)
    for text in ("{not json", json.dumps({"version": 9, "offsets": []}),
                 json.dumps({"version": 1, "offsets": [{"topic": "t", "broker_group": "a",
                                                        "queue_id": 0, "offset": -4}]})):
        store.path.write_text(text)
        with pytest.raises(OffsetStoreError, match="not a valid offset file"):
            store.open()
    store.path.write_text(json.dumps({"version": 1, "offsets": []}))
    store.open()  # the failed opens released the lock
    store.close()


def test_one_holder_at_a_time(tmp_path: Path) -> None:
    first = LocalOffsetStore(tmp_path, "g", "c")
    first.open()
    with pytest.raises(OffsetStoreLockedError, match="give each broadcasting consumer"):
        LocalOffsetStore(tmp_path, "g", "c").open()
    other = LocalOffsetStore(tmp_path, "g", "another-client")
    other.open()  # another client id: its own file
    other.close()
    first.close()
    last = LocalOffsetStore(tmp_path, "g", "c")
    last.open()  # released by close
    last.close()


def test_a_default_id_in_use_takes_the_next_spare_and_gets_it_back_when_free(
        tmp_path: Path) -> None:
    """Two broadcasting consumers of one group on one host with the default id: the second
    takes ``<id>#2``; a restarted one takes the first free, its own file when it runs alone."""
    first = LocalOffsetStore(tmp_path, "g", "host@DEFAULT", slots=3)
    first.open()
    second = LocalOffsetStore(tmp_path, "g", "host@DEFAULT", slots=3)
    second.open()
    third = LocalOffsetStore(tmp_path, "g", "host@DEFAULT", slots=3)
    third.open()
    assert (first.client_id, second.client_id, third.client_id) == (
        "host@DEFAULT", "host@DEFAULT#2", "host@DEFAULT#3")
    assert second.path == tmp_path / "host@DEFAULT%232" / "g.json"  # (quoted: a file name)
    with pytest.raises(OffsetStoreLockedError, match="host@DEFAULT#3"):
        LocalOffsetStore(tmp_path, "g", "host@DEFAULT", slots=3).open()  # all in use
    first.offsets[MQ] = 5
    first.write({MQ: 5})
    for store in (first, second, third):
        store.close()
    again = LocalOffsetStore(tmp_path, "g", "host@DEFAULT", slots=3)
    again.open()
    assert again.client_id == "host@DEFAULT" and again.get(MQ) == 5
    again.close()
