"""The files an agent leaves, carried from its worker to the gateway's bot in PostgreSQL (docs/fleet.md, "Files").

Real processes: `agent-bridge worker` and `agent-bridge serve --postgres` against a throwaway PostgreSQL cluster.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleetkit import Fleet, eventually, turn
from hostkit import Lab
from test_cli import agent_profile

from bridge.dialects.events import FileEvent
from bridge.host.postgres import fleet_files, queue
from bridge.host.postgres.db import connect
from bridge.outbox import media_type_of
from bridge.result import Outcome, TurnResult

BIG = bytes(range(256)) * 10_000  # 2.5 MB: more than two pieces of fleet_files.CHUNK_BYTES
MAKES_FILES = """
import os, pathlib
outbox = pathlib.Path(os.environ["AGENT_OUTBOX"])
(outbox / "report.txt").write_text("two lines\\nof report\\n")
(outbox / "big.bin").write_bytes(bytes(range(256)) * 10_000)
(outbox / "empty.txt").write_bytes(b"")
print("done")
"""


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    lab = Lab(tmp_path)
    (tmp_path / "work").mkdir()
    agent_profile(lab.profiles, MAKES_FILES, name="maker", cwd=str(tmp_path / "work"))
    return lab


@pytest.fixture
def fleet(lab: Lab, pg_dsn: str) -> Iterator[Fleet]:
    fleet = Fleet(lab, pg_dsn)
    try:
        yield fleet
    finally:
        fleet.stop()


def test_the_agent_s_files_reach_the_bot_through_the_gateway_with_their_bytes(
    fleet: Fleet, lab: Lab, tmp_path: Path
) -> None:
    fleet.worker()
    gateway = fleet.gateway()
    gateway.send(turn("t1", "go", profile="maker", inline_files_max_bytes=100))
    responses = gateway.until("result", "t1")
    assert [response["type"] for response in responses] == ["accepted", "file", "file", "file", "result"], responses
    big, empty, report = responses[1:4]
    assert [file["name"] for file in responses[-1]["files"]] == ["big.bin", "empty.txt", "report.txt"]
    assert (big["size"], big["media_type"], "data" in big) == (len(BIG), "application/octet-stream", False)
    assert Path(big["path"]).read_bytes() == BIG
    assert not Path(big["path"]).is_relative_to(tmp_path)  # the gateway's own copy, not the worker's outbox
    assert base64.b64decode(report["data"]) == b"two lines\nof report\n"  # small enough to travel inline
    assert (empty["size"], base64.b64decode(empty["data"])) == (0, b"")
    eventually(lambda: not any((tmp_path / "work").iterdir()), "the worker to remove its outbox (the bytes are stored)")
    assert fleet.query("SELECT count(*) FROM bridge_turn_files") == [(0,)]  # the gateway took them
    gateway.send({"type": "ack_file", "id": "t1", "file": "big.bin"})
    eventually(lambda: not Path(big["path"]).exists(), "the acknowledged file to be deleted")
    assert not Path(big["path"]).parent.exists()

    gateway.send(turn("t2", "go", profile="maker", conversation="other"))
    kept = gateway.until("result", "t2")[1]
    assert Path(kept["path"]).exists()
    assert gateway.close() == 0
    assert not Path(kept["path"]).parent.exists()  # nothing the bot did not take outlives the gateway


def test_the_profile_s_outbox_limits_bound_what_travels(fleet: Fleet, lab: Lab, tmp_path: Path) -> None:
    agent_profile(
        lab.profiles, MAKES_FILES, name="maker", cwd=str(tmp_path / "work"), outbox_max_files=2, outbox_max_bytes=1000
    )
    fleet.worker()
    gateway = fleet.gateway()
    gateway.send(turn("t1", "go", profile="maker"))
    responses = gateway.until("result", "t1")
    result = responses[-1]
    assert [file["name"] for file in result["files"]] == ["empty.txt", "report.txt"]
    assert "'big.bin' not sent" in result["files_note"]
    notices = [response for response in responses if response["type"] == "activity"]
    assert notices and "'big.bin' not sent" in notices[0]["text"]
    offered = [response for response in responses if response["type"] == "file"]
    assert base64.b64decode(offered[0]["data"]) == b""  # an empty file is always inline
    assert Path(offered[1]["path"]).read_bytes() == b"two lines\nof report\n"
    eventually(lambda: not any((tmp_path / "work").iterdir()), "what was left out to go with the worker's outbox")


def _queued_turn(conn: object, key: str) -> None:
    queue.enqueue(
        conn,
        key=key,
        turn_id=key,
        request_id=key,
        gateway="g",
        profile="p",
        conversation="c",
        session_name="default",
        turn={},
        max_queued=10,
    )


def _result(*files: FileEvent) -> TurnResult:
    return TurnResult("r", "", "", "", 0, False, Outcome.OK, "", 1, 0, False, files=files)


def test_a_file_changed_after_the_turn_is_left_out_and_rows_read_once_are_gone(pg_dsn: str, tmp_path: Path) -> None:
    kept, changed = tmp_path / "kept.txt", tmp_path / "changed.txt"
    kept.write_bytes(b"kept")
    changed.write_bytes(b"before")
    files = [
        FileEvent(path.name, str(path), 6 if path is changed else 4, media_type_of(path.name))
        for path in (
            changed,
            kept,
        )
    ]
    changed.write_bytes(b"after, and longer")
    conn = connect(pg_dsn, autocommit=True)
    try:
        _queued_turn(conn, "k1")
        with conn.transaction():
            stored = fleet_files.store(conn, "k1", _result(*files))
        assert [file.name for file in stored.files] == ["kept.txt"]
        assert "'changed.txt' changed after the turn ended" in stored.files_note
        with conn.transaction():
            received, problem = fleet_files.load(conn, "k1", stored)
        assert problem == "" and Path(received.files[0].path).read_bytes() == b"kept"
        assert conn.execute("SELECT count(*) FROM bridge_turn_files").fetchone() == (0,)
        with conn.transaction():
            again, problem = fleet_files.load(conn, "k1", stored)  # another gateway, after a crash
        assert again.files == () and "'kept.txt' not sent: no longer stored" in problem
        assert problem in again.files_note and stored.files_note in again.files_note
        # A name no outbox can hold is never written anywhere.
        odd = dataclasses.replace(stored, files=(dataclasses.replace(files[1], name="../kept.txt"),))
        with conn.transaction():
            assert fleet_files.load(conn, "k1", odd)[0].files == ()
        # The rows go with the turn's.
        with conn.transaction():
            fleet_files.store(conn, "k1", _result(files[1]))
        conn.execute("DELETE FROM bridge_turns WHERE key = 'k1'")
        assert conn.execute("SELECT count(*) FROM bridge_turn_files").fetchone() == (0,)
    finally:
        conn.close()
