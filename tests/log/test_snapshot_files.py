"""Snapshot transfers below the node: the stream's frames (round trips, hostile input refused by
name), staging on the follower's disk (resuming a file from what is held, refusing a file that
is short or differs), the install committed by one rename and finished again after a crash at
any of its steps, the log store's share of a snapshot, and a transfer between a real sender and
receiver over TCP that is broken mid-way and resumes where it stopped."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.network.peer_stream import PeerStream
from dledger.network.wire import SnapshotHello, decode_message
from dledger.raft.types import Entry, EntryKind, InstallSnapshot, Membership, SnapshotMeta
from dledger.snapshots.files import (
    INSTALL_DIR,
    STAGING_DIR,
    Staging,
    commit_install,
    finish_install,
    staged_meta,
)
from dledger.snapshots.receive import SnapshotReceiver
from dledger.snapshots.send import SnapshotSendError, SnapshotSource, SourceFile, send_snapshot
from dledger.snapshots.wire import (
    Chunk,
    Done,
    Have,
    Offer,
    Refuse,
    Staged,
    decode_snapshot_frame,
    encode_snapshot_frame,
    valid_file_name,
)
from dledger.storage.commitlog import FileLogStore
from protocol.errors import StorageError, WireError
from protocol.frames import FrameDecoder

META = SnapshotMeta(42, 3, Membership(("n0", "n1", "n2")))
MEMBERS = META.membership.encode()


def _payload(frame: Any) -> bytes:
    return FrameDecoder().feed(encode_snapshot_frame(frame))[0]


# -- frames ----------------------------------------------------------------------------------------

FRAMES = [
    Offer(3, "n0", "n1", META, (("log/meta", 36), ("log/00000000000000000000.data", 1 << 30),
                                ("app/broker.checkpoint", 0))),
    Have(((0, hashlib.sha256().digest()), (17, b"d" * 32))),
    Chunk(1, 4096, b"abc", zlib.crc32(b"abc")),
    Done((b"\x00" * 32, b"\xff" * 32)),
    Staged(),
    Refuse("no"),
]


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: type(f).__name__)
def test_every_frame_round_trips(frame: Any) -> None:
    assert decode_snapshot_frame(_payload(frame)) == frame


@pytest.mark.parametrize("name", ["log/../x", "/etc/passwd", "app/", "x/file", "log/a/b/c/d",
                                  "app/.hidden", "log/a b", "", "app/" + "x" * 200])
def test_a_file_name_outside_log_or_app_is_refused(name: str) -> None:
    assert not valid_file_name(name)
    offer = Offer(1, "n0", "n1", META, ((name, 1),))
    with pytest.raises(WireError, match="file name"):
        decode_snapshot_frame(_payload(offer))


@pytest.mark.parametrize("fields, match", [
    ([16, 1, "n0", "n1", 1, 1, MEMBERS, [["log/x", 1], ["log/x", 2]]], "repeated"),
    ([16, -1, "n0", "n1", 1, 1, MEMBERS, []], "Offer.term"),
    ([16, 1, "n0", "n1", 1, 1, b"junk", []], "Offer.membership"),
    ([18, 0, 0, b"", 0], "non-empty"),
    ([18, 0, 0, b"x", 1 << 33], "crc32"),
    ([17, [[1, 2, 3]]], "pairs"),
    ([17, [[1, b"short"]]], "SHA-256"),
    ([19, ["x"]], "SHA-256"),
    ([20, 1], "expected 0"),
    ([99], "unknown snapshot stream kind"),
])
def test_malformed_frames_are_refused_by_name(fields: list[Any], match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode_snapshot_frame(cbor2.dumps([1, *fields]))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_a_wire_error_never_a_crash(data: bytes) -> None:
    try:
        decode_snapshot_frame(data)
    except WireError:
        pass


def test_the_stream_hello_is_a_peer_message_of_its_own() -> None:
    from dledger.network.wire import encode_message
    assert decode_message(encode_message(SnapshotHello("a", "n0"))) == SnapshotHello("a", "n0")


# -- staging and installing ------------------------------------------------------------------------


def _offer(files: dict[str, bytes]) -> Offer:
    return Offer(3, "n0", "n1", META, tuple((n, len(b)) for n, b in files.items()))


def _stage(data_dir: Path, files: dict[str, bytes], upto: dict[str, int] | None = None) -> Staging:
    staging = Staging(str(data_dir))
    staging.begin(_offer(files))
    for k, (name, body) in enumerate(files.items()):
        cut = len(body) if upto is None else upto.get(name, len(body))
        if cut:
            staging.write(k, 0, body[:cut])
    return staging


FILES = {"log/meta": b"M" * 36, "log/00000000000000000000.data": os.urandom(5000),
         "app/broker.checkpoint": b"C" * 300, "app/empty": b""}


def test_a_new_offer_resumes_what_is_held_and_drops_the_rest(tmp_path: Path) -> None:
    data = "log/00000000000000000000.data"
    _stage(tmp_path, {**FILES, "log/stale.data": b"s"}, upto={data: 1000})
    held = Staging(str(tmp_path)).begin(_offer(FILES))
    body = FILES[data]
    assert held[list(FILES).index(data)] == (1000, hashlib.sha256(body[:1000]).digest())
    assert not (tmp_path / STAGING_DIR / "log" / "stale.data").exists()
    assert staged_meta(str(tmp_path)) is None  # not complete


def test_two_different_meta_records_are_not_taken_for_one_another(tmp_path: Path) -> None:
    """A record that ends with its own CRC32 (the log's meta) has the CRC32 of any other such
    record: resuming by CRC32 installed a stale meta once. Digests tell them apart."""
    from dledger.storage.entry_codec import encode_meta
    old, new = encode_meta(118, 1, 130558), encode_meta(176, 1, 195808)
    assert zlib.crc32(old) == zlib.crc32(new)  # (why CRC32 will not do)
    _stage(tmp_path, {"log/meta": old})
    held = Staging(str(tmp_path)).begin(_offer({"log/meta": new}))
    assert held == [(36, hashlib.sha256(old).digest())] != [(36, hashlib.sha256(new).digest())]


def test_finish_refuses_a_short_or_different_file(tmp_path: Path) -> None:
    data = "log/00000000000000000000.data"
    staging = _stage(tmp_path, FILES, upto={data: 10})
    digests = [hashlib.sha256(b).digest() for b in FILES.values()]
    with pytest.raises(StorageError, match="10 of 5000 bytes"):
        staging.finish(digests)
    staging = _stage(tmp_path / "b", FILES)
    with pytest.raises(StorageError, match="SHA-256"):
        staging.finish([b"\x00" * 32, *digests[1:]])
    with pytest.raises(StorageError, match="chunk at 7"):
        staging.write(1, 7, b"x")  # not where the file ends


def _installed_tree(data_dir: Path) -> dict[str, bytes]:
    out = {}
    for root, _, names in os.walk(data_dir):
        for name in names:
            path = Path(root) / name
            out[str(path.relative_to(data_dir))] = path.read_bytes()
    return out


def _prepare(data_dir: Path) -> None:
    (data_dir / "log").mkdir(parents=True)
    (data_dir / "log" / "old.data").write_bytes(b"old log")
    (data_dir / "index").mkdir()
    (data_dir / "index" / "1.idx").write_bytes(b"old index")
    (data_dir / "broker.checkpoint").write_bytes(b"old checkpoint")
    (data_dir / "hardstate").write_bytes(b"term and vote")
    staging = _stage(data_dir, FILES)
    staging.finish([hashlib.sha256(b).digest() for b in FILES.values()])
    commit_install(str(data_dir), META)


EXPECTED = {"log/meta": FILES["log/meta"],
            "log/00000000000000000000.data": FILES["log/00000000000000000000.data"],
            "broker.checkpoint": FILES["app/broker.checkpoint"], "empty": b"",
            "hardstate": b"term and vote"}


def test_an_install_replaces_the_log_and_the_apps_files_and_drops_derived_data(
        tmp_path: Path) -> None:
    _prepare(tmp_path)
    assert finish_install(str(tmp_path), "log", ("index",))
    assert _installed_tree(tmp_path) == EXPECTED
    assert not finish_install(str(tmp_path), "log", ("index",))  # nothing more to do


def test_an_install_cut_short_at_any_step_is_finished_by_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = 0
    for crash_at in range(1, 40):
        data_dir = tmp_path / str(crash_at)
        _prepare(data_dir)
        calls = 0

        def crashing(real: Callable[..., Any], crash_at: int = crash_at) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                nonlocal calls
                calls += 1
                if calls == crash_at:
                    raise KeyboardInterrupt("power lost")  # (not an OSError: nothing catches it)
                return real(*args, **kwargs)
            return call
        with monkeypatch.context() as m:
            for mod, name in ((os, "rename"), (os, "unlink"), (shutil, "rmtree"),
                              (os, "fsync")):
                m.setattr(mod, name, crashing(getattr(mod, name)))
            try:
                finish_install(str(data_dir), "log", ("index",))
                crashed = False
            except KeyboardInterrupt:
                crashed = True
        finish_install(str(data_dir), "log", ("index",))  # the next start
        assert _installed_tree(data_dir) == EXPECTED, crash_at
        if not crashed:
            steps = crash_at
            break
    assert steps > 5  # every step up to the end was cut once


def test_nothing_is_installed_without_a_complete_staging(tmp_path: Path) -> None:
    _stage(tmp_path, FILES, upto={"app/broker.checkpoint": 3})
    with pytest.raises(StorageError, match="no complete staged snapshot"):
        commit_install(str(tmp_path), META)
    assert not (tmp_path / INSTALL_DIR).exists()


# -- the log store's share -------------------------------------------------------------------------


def test_the_logs_share_ends_at_the_snapshots_entry_and_reopens_as_that_log(tmp_path: Path) -> None:
    store = FileLogStore.open(tmp_path / "log", segment_bytes_max=1024)
    store.append([Entry(i, 1, EntryKind.NORMAL, b"e%03d" % i * 20) for i in range(1, 61)])
    store.sync()
    store.retain_from(20)
    meta, segments = store.snapshot_files(45)
    out = tmp_path / "copy"
    out.mkdir()
    (out / "meta").write_bytes(meta)
    for name, path, size in segments:
        with open(path, "rb") as f:
            (out / name).write_bytes(f.read(size))
    copy = FileLogStore.open(out, segment_bytes_max=1024)
    assert (copy.first_index(), copy.last_index()) == (store.first_index(), 45)
    assert copy.entries(copy.first_index(), 46, 1 << 20) == store.entries(store.first_index(), 46, 1 << 20)
    copy.append([Entry(46, 2, EntryKind.NORMAL, b"next")])
    assert copy.position_of(46) == store.position_of(46)  # positions go on as on the leader
    with pytest.raises(IndexError):
        store.snapshot_files(61)
    copy.close()
    store.close()


# -- a transfer over TCP, broken and resumed -------------------------------------------------------


def test_a_transfer_broken_mid_way_resumes_after_what_the_follower_holds(tmp_path: Path) -> None:
    body = os.urandom(300_000)
    arrived: list[InstallSnapshot] = []

    async def run() -> None:
        receiver = SnapshotReceiver(str(tmp_path), "n1", lambda: 3, arrived.append, 5.0)
        limit = {"bytes": 100_000}

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            decoder, budget = FrameDecoder(), limit["bytes"]
            transport = writer.transport
            stream: PeerStream | None = None
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                budget -= len(data)
                for payload in decoder.feed(data):
                    if stream is None:
                        assert decode_message(payload) == SnapshotHello("g", "n0")
                        stream = PeerStream(transport, "n0")  # type: ignore[arg-type]
                        receiver.accept(stream)
                    else:
                        stream.feed(payload)
                if budget <= 0:
                    transport.abort()  # the link breaks mid-way
                    break
            if stream is not None:
                stream.connection_lost()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        addr = server.sockets[0].getsockname()[:2]

        def source() -> SnapshotSource:
            return SnapshotSource(META, [SourceFile("log/meta", 36, content=b"m" * 36),
                                         SourceFile("app/big", len(body), content=body)])
        attempts = 0
        while not arrived and attempts < 10:
            attempts += 1
            try:
                await send_snapshot(addr, "g", "n0", 3, "n1", source(), timeout_s=5.0,
                                    chunk_bytes=16384)
            except SnapshotSendError:
                continue
        assert 3 <= attempts <= 5  # 300 kB through a link cut every 100 kB: only by resuming
        assert (tmp_path / STAGING_DIR / "app" / "big").read_bytes() == body
        assert arrived == [InstallSnapshot(3, "n0", "n1", META)]
        await receiver.stop()
        server.close()
        await server.wait_closed()

    asyncio.run(run())
