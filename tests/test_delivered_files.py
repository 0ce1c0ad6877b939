"""A delivered file is the file that was collected, and removing it removes nothing else (docs/attachments-out.md).

After its turn, an agent still owns its outbox: it may swap a collected file
for a link to a secret, rewrite it, or move the whole outbox aside and put a
link to the user's home in its place. What the bridge then sends — `GET` of
the door's URL, serve's inline `data`, the fleet's stored bytes — must be the
inode collected or nothing, and what it deletes — `ack_file`, `DELETE`,
`--file-ttl` expiry, serve's end — must be inside the outbox. The stand-in
home holds files of the same names and sizes as the agent's, so only the
inode tells them apart.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from hostkit import Lab
from test_cli import agent_profile
from test_network import TOKEN_A, TOKENS, bearer, door, sse_events
from test_outbox import serving
from test_sandbox import RUNTIME

import bridge.files.outbox as outbox_module
from bridge.dialects.events import FileEvent
from bridge.engine.result import Outcome, TurnResult
from bridge.errors import OutboxError
from bridge.files.outbox import collect, read_file, remove_outbox
from bridge.host.postgres import fleet_files
from bridge.serving.file_delivery import FileDeliveries

REPORT = b"the agent's report\n"
SECRET = b"SECRET of the home\n"  # as long as REPORT: a size check alone does not tell them apart
assert len(REPORT) == len(SECRET)

WRITES_A_REPORT = f"""
import os, sys
name = sys.argv[1] if len(sys.argv) > 1 else "report.txt"
with open(os.path.join(os.environ["AGENT_OUTBOX"], name), "wb") as out:
    out.write({REPORT!r})
print("done")
"""


def files_lab(tmp_path: Path) -> Lab:
    """A lab whose profile `maker` leaves `report.txt`, and a stand-in home holding a secret of that name."""
    lab = Lab(tmp_path)
    (tmp_path / "work").mkdir()
    agent_profile(lab.profiles, WRITES_A_REPORT, name="maker", cwd=str(tmp_path / "work"))
    home = tmp_path / "home"
    home.mkdir()
    (home / "report.txt").write_bytes(SECRET)
    return lab


def home_of(lab: Lab) -> Path:
    return lab.root / "home"


def move_outbox_aside_for_a_link_home(outbox: Path, home: Path) -> Path:
    """What the agent does after its turn: its outbox renamed, a link to the home in its place; the new name."""
    aside = outbox.with_name(outbox.name + "-aside")
    outbox.rename(aside)
    outbox.symlink_to(home, target_is_directory=True)
    return aside


def swap_file_for_a_link_home(file: Path, home: Path) -> None:
    file.unlink()
    file.symlink_to(home / file.name)


def result_with(files: tuple[FileEvent, ...]) -> TurnResult:
    return TurnResult("", "", "", "", 0, False, Outcome.OK, "", 0, 0, False, files=files)


def turn(request_id: str, **fields: Any) -> dict[str, Any]:
    return {"type": "turn", "id": request_id, "profile": "maker", "conversation": request_id, "message": "go"} | fields


# ---------------------------------------------------------------------------- serve on stdin/stdout


async def test_ack_file_after_the_outbox_became_a_link_home_deletes_nothing_there(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    async with serving(lab) as client:
        await client.send(turn("t1"))
        offered = (await client.until("result", "t1"))[1]
        outbox = Path(offered["path"]).parent
        aside = move_outbox_aside_for_a_link_home(outbox, home_of(lab))
        await client.send({"type": "ack_file", "id": "t1", "file": "report.txt"})
        await client.send({"type": "stats", "id": "s"})
        await client.until("stats", "s")
        assert (home_of(lab) / "report.txt").read_bytes() == SECRET, "ack_file deleted the home's file"
        assert not (aside / "report.txt").exists(), "the file acknowledged is the one collected, wherever it is now"
        assert outbox.is_symlink(), "the agent's link is not the outbox: it stays"


async def test_files_expiring_after_the_outbox_became_a_link_home_delete_nothing_there(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    async with serving(lab, file_ttl=0.2) as client:
        await client.send(turn("t1"))
        offered = (await client.until("result", "t1"))[1]
        aside = move_outbox_aside_for_a_link_home(Path(offered["path"]).parent, home_of(lab))
        with trio.fail_after(5):  # the file's time runs out: one of the two goes
            while (aside / "report.txt").exists() and (home_of(lab) / "report.txt").exists():
                await trio.sleep(0.02)
        assert (home_of(lab) / "report.txt").read_bytes() == SECRET, "the expiry deleted the home's file"
        assert list(aside.iterdir()) == []


async def test_serve_ending_after_the_outbox_became_a_link_home_deletes_nothing_there(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    (home_of(lab) / "other").write_text("kept")
    async with serving(lab) as client:
        await client.send(turn("t1"))
        offered = (await client.until("result", "t1"))[1]
        aside = move_outbox_aside_for_a_link_home(Path(offered["path"]).parent, home_of(lab))
    assert sorted(path.name for path in home_of(lab).iterdir()) == ["other", "report.txt"]
    assert (home_of(lab) / "report.txt").read_bytes() == SECRET
    assert list(aside.iterdir()) == []  # serve took its waiting file with it, from where it is now


async def test_an_inline_file_is_the_file_collected_even_when_its_outbox_became_a_link(tmp_path: Path) -> None:
    outbox = tmp_path / "work" / "outbox"
    outbox.mkdir(parents=True)
    (outbox / "report.txt").write_bytes(REPORT)
    home = tmp_path / "home"
    home.mkdir()
    (home / "report.txt").write_bytes(SECRET)
    (file,) = collect(str(outbox)).files
    aside = move_outbox_aside_for_a_link_home(outbox, home)  # between the collecting and the sending
    async with trio.open_nursery() as nursery:
        deliveries = FileDeliveries(nursery)
        offered = deliveries.offer("t1", file, inline_max_bytes=1024)
        deliveries.turn_over(result_with((file,)))
        deliveries.close()
    assert base64.b64decode(offered["data"]) == REPORT
    assert (home / "report.txt").read_bytes() == SECRET, "the inline file's removal deleted the home's file"
    assert list(aside.iterdir()) == []


async def test_an_inline_file_swapped_for_a_link_or_rewritten_is_not_sent_inline(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    (outbox / "linked.txt").write_bytes(REPORT)
    (outbox / "rewritten.txt").write_bytes(REPORT)
    (tmp_path / "linked.txt").write_bytes(SECRET)
    linked, rewritten = collect(str(outbox)).files
    swap_file_for_a_link_home(outbox / "linked.txt", tmp_path)
    (outbox / "rewritten.txt").write_bytes(SECRET)  # the same inode and size, other bytes
    async with trio.open_nursery() as nursery:
        deliveries = FileDeliveries(nursery)
        offers = [deliveries.offer("t1", file, inline_max_bytes=1024) for file in (linked, rewritten)]
        deliveries.close()
    assert ["data" in offer for offer in offers] == [False, False], "a changed file is offered by path, if at all"
    assert (tmp_path / "linked.txt").read_bytes() == SECRET


# ---------------------------------------------------------------------------- the network door


async def test_the_door_never_serves_what_the_agent_put_in_place_of_a_collected_file(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    async with door(lab, tokens=TOKENS) as url, httpx.AsyncClient(base_url=url) as http:
        offers = {}
        for request_id in ("linked", "rewritten", "moved"):
            body = {"id": request_id, "profile": "maker", "conversation": request_id, "message": "go"}
            events = sse_events((await http.post("/v1/turns", json=body, headers=bearer(TOKEN_A))).text)
            offers[request_id] = next(data for kind, data in events if kind == "file")
        swap_file_for_a_link_home(Path(offers["linked"]["path"]), home_of(lab))
        Path(offers["rewritten"]["path"]).write_bytes(SECRET)  # the same inode and size, other bytes
        move_outbox_aside_for_a_link_home(Path(offers["moved"]["path"]).parent, home_of(lab))
        linked = await http.get(offers["linked"]["url"], headers=bearer(TOKEN_A))
        rewritten = await http.get(offers["rewritten"]["url"], headers=bearer(TOKEN_A))
        moved = await http.get(offers["moved"]["url"], headers=bearer(TOKEN_A))
    for response in (linked, rewritten):
        assert SECRET not in response.content, "the door sent what the agent put in place of its file"
        assert (response.status_code, response.json()["code"]) == (410, "unknown_file"), response.text
    assert "changed after the turn ended" in rewritten.json()["message"]
    assert (moved.status_code, moved.content) == (200, REPORT), "the file sent is the inode collected"


async def test_delete_on_a_file_url_after_the_outbox_became_a_link_home_deletes_nothing_there(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    async with door(lab, tokens=TOKENS) as url, httpx.AsyncClient(base_url=url) as http:
        body = {"id": "f", "profile": "maker", "conversation": "c", "message": "go"}
        events = sse_events((await http.post("/v1/turns", json=body, headers=bearer(TOKEN_A))).text)
        offered = next(data for kind, data in events if kind == "file")
        aside = move_outbox_aside_for_a_link_home(Path(offered["path"]).parent, home_of(lab))
        deleted = await http.delete(offered["url"], headers=bearer(TOKEN_A))
        assert deleted.status_code == 200
        assert (home_of(lab) / "report.txt").read_bytes() == SECRET, "DELETE removed the home's file"
        assert list(aside.iterdir()) == []
    assert (home_of(lab) / "report.txt").read_bytes() == SECRET


async def test_file_urls_work_for_ids_with_slashes_and_names_with_percent_spaces_and_unicode(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    name = "100% sûr & co #1?.txt"
    agent_profile(
        lab.profiles, WRITES_A_REPORT.replace('"report.txt"', repr(name)), name="namer", cwd=str(tmp_path / "work")
    )
    async with door(lab, tokens=TOKENS) as url, httpx.AsyncClient(base_url=url) as http:
        body = {"id": "a/b/../c", "profile": "namer", "conversation": "c", "message": "go"}
        events = sse_events((await http.post("/v1/turns", json=body, headers=bearer(TOKEN_A))).text)
        offered = next(data for kind, data in events if kind == "file")
        assert offered["name"] == name
        downloaded = await http.get(offered["url"], headers=bearer(TOKEN_A))
        assert (downloaded.status_code, downloaded.content) == (200, REPORT), offered["url"]
        assert "filename*=utf-8''100%25%20s%C3%BBr" in downloaded.headers["content-disposition"]
        deleted = await http.delete(offered["url"], headers=bearer(TOKEN_A))
        assert deleted.status_code == 200, deleted.text
        assert not Path(offered["path"]).exists()


# ---------------------------------------------------------------------------- the fleet's stored files


class _RecordingConnection:
    """Enough of a psycopg connection for `fleet_files.store`: the pieces it inserts, by file."""

    def __init__(self) -> None:
        self.stored: dict[int, bytes] = {}

    def execute(self, statement: str, parameters: tuple[Any, ...]) -> None:
        if statement.startswith("INSERT"):
            _, place, _, data = parameters
            self.stored[place] = self.stored.get(place, b"") + data

    def transaction(self) -> Any:
        return _NoTransaction()


class _NoTransaction:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_worker_stores_the_file_collected_not_what_the_agent_put_in_its_place(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    for name in ("moved.txt", "rewritten.txt"):
        (outbox / name).write_bytes(REPORT)
    home = tmp_path / "home"
    home.mkdir()
    for name in ("moved.txt", "rewritten.txt"):
        (home / name).write_bytes(SECRET)
    files = collect(str(outbox)).files
    aside = move_outbox_aside_for_a_link_home(outbox, home)
    (aside / "rewritten.txt").write_bytes(SECRET)
    conn = _RecordingConnection()
    stored = fleet_files.store(conn, "k", result_with(files))
    assert [file.name for file in stored.files] == ["moved.txt"]
    assert conn.stored == {0: REPORT}
    assert "'rewritten.txt' changed after the turn ended" in stored.files_note
    remove_outbox(str(outbox))
    assert sorted(path.name for path in home.iterdir()) == ["moved.txt", "rewritten.txt"]
    assert list(aside.iterdir()) == []


# ---------------------------------------------------------------------------- a sandboxed agent attacks


def attacker_profile(lab: Lab) -> None:
    """`attacker`: a sandboxed agent that cannot see the home, and in its turn moves every other outbox of its
    working directory aside and puts a link to the home (by path) in its place."""
    source = f"""
    import os
    own = os.environ["AGENT_OUTBOX"]
    outboxes = os.path.dirname(own)
    assert not os.path.exists({str(home_of(lab))!r}), "the sandbox shows the home"
    for name in os.listdir(outboxes):
        path = os.path.join(outboxes, name)
        if path != own and not name.startswith("."):
            os.rename(path, path + "-aside")
            os.symlink({str(home_of(lab))!r}, path)
    print("moved")
    """
    sandbox = {"read": [str(lab.profiles), *RUNTIME]}
    agent_profile(lab.profiles, source, name="attacker", cwd=str(lab.root / "work"), sandbox=sandbox)


async def test_a_sandboxed_agent_s_later_turn_cannot_redirect_serve_s_deletes_home(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    attacker_profile(lab)
    async with serving(lab) as client:
        await client.send(turn("t1"))
        offered = (await client.until("result", "t1"))[1]
        await client.send(turn("t2", profile="attacker"))
        assert (await client.until("result", "t2"))[-1]["reply"] == "moved"
        outbox = Path(offered["path"]).parent
        assert outbox.is_symlink()
        await client.send({"type": "ack_file", "id": "t1", "file": "report.txt"})
        await client.send({"type": "stats", "id": "s"})
        await client.until("stats", "s")
        assert (home_of(lab) / "report.txt").read_bytes() == SECRET, "ack_file deleted the home's file"
    assert (home_of(lab) / "report.txt").read_bytes() == SECRET, "serve's end deleted the home's file"
    assert list(Path(str(outbox) + "-aside").iterdir()) == []


async def test_a_sandboxed_agent_s_later_turn_cannot_make_the_door_serve_or_delete_home(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    attacker_profile(lab)
    async with door(lab, tokens=TOKENS) as url, httpx.AsyncClient(base_url=url) as http:
        body = {"id": "t1", "profile": "maker", "conversation": "c", "message": "go"}
        events = sse_events((await http.post("/v1/turns", json=body, headers=bearer(TOKEN_A))).text)
        offered = next(data for kind, data in events if kind == "file")
        body = {"id": "t2", "profile": "attacker", "conversation": "c", "message": "go"}
        events = sse_events((await http.post("/v1/turns", json=body, headers=bearer(TOKEN_A))).text)
        assert events[-1][1]["reply"] == "moved"
        downloaded = await http.get(offered["url"], headers=bearer(TOKEN_A))
        assert (downloaded.status_code, downloaded.content) == (200, REPORT), "not the file the turn collected"
        assert (await http.delete(offered["url"], headers=bearer(TOKEN_A))).status_code == 200
        assert (home_of(lab) / "report.txt").read_bytes() == SECRET, "DELETE removed the home's file"
    assert (home_of(lab) / "report.txt").read_bytes() == SECRET


def test_held_outboxes_are_bounded_the_oldest_let_go_of_with_its_files_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_module, "MAX_HELD_OUTBOXES", 16)
    outboxes = []
    for number in range(17):
        outbox = tmp_path / f"outbox-{number}"
        outbox.mkdir()
        (outbox / "report.txt").write_bytes(REPORT)
        outboxes.append(collect(str(outbox)).files[0])
    with pytest.raises(OutboxError, match="no longer waiting"):
        read_file(outboxes[0])
    remove_outbox(str(tmp_path / "outbox-0"))  # let go of: removed by its path, the last component not followed
    assert [read_file(file) for file in outboxes[1:]] == [REPORT] * 16
    for number in range(1, 17):
        remove_outbox(str(tmp_path / f"outbox-{number}"))
    assert list(tmp_path.iterdir()) == []


def test_an_outbox_not_held_is_removed_only_beneath_a_state_directory_that_is_no_link(tmp_path: Path) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "home"
    (elsewhere / "outbox" / "turn-1").mkdir(parents=True)
    (elsewhere / "outbox" / "turn-1" / "id_rsa").write_text("secret")
    work.mkdir()
    (work / ".agent-bridge").symlink_to(elsewhere)  # planted by the agent in its working directory
    remove_outbox(str(work / ".agent-bridge" / "outbox" / "turn-1"))
    assert (elsewhere / "outbox" / "turn-1" / "id_rsa").read_text() == "secret"
    (work / ".agent-bridge").unlink()
    (work / ".agent-bridge" / "outbox" / "turn-1").mkdir(parents=True)
    (work / ".agent-bridge" / "outbox" / "turn-1" / "f").write_text("x")
    remove_outbox(str(work / ".agent-bridge" / "outbox" / "turn-1"))
    assert list((work / ".agent-bridge" / "outbox").iterdir()) == []
