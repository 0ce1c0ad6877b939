"""Files out: the agent's outbox, collected into `FileEvent`s and `TurnResult.files` (docs/attachments-out.md)."""

from __future__ import annotations

import ast
import base64
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from attachment_files import left_in
from hostkit import Lab
from test_cli import agent_profile, cli, ndjson
from test_serve import Client

import bridge
from bridge.cli.serve import Server
from bridge.dialects.events import FileEvent
from bridge.errors import OutboxError
from bridge.files.outbox import collect, read_file, remove_outbox
from bridge.files.turn_directory import MAX_SPARES, SPARE_OUTBOXES, TurnFiles

TWO_FILES = """
import os, pathlib
outbox = pathlib.Path(os.environ["AGENT_OUTBOX"])
(outbox / "report.txt").write_text("two lines\\nof report\\n")
(outbox / "chart.png").write_bytes(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(100))
print("done")
"""


def test_collect_lists_regular_files_by_name(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("bb")
    (tmp_path / "a.json").write_text("{}")
    collected = collect(str(tmp_path))
    assert collected.files == (
        FileEvent("a.json", str(tmp_path / "a.json"), 2, "application/json"),
        FileEvent("b.txt", str(tmp_path / "b.txt"), 2, "text/plain"),
    )
    assert collected.note == ""


def test_a_missing_outbox_holds_nothing(tmp_path: Path) -> None:
    assert collect(str(tmp_path / "none")) == collect(str(tmp_path))


def test_links_directories_and_fifos_are_not_sent(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the bridge's own")
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    (outbox / "link").symlink_to(secret)
    (outbox / "sub").mkdir()
    os.mkfifo(outbox / "pipe")
    (outbox / "ok.txt").write_text("fine")
    collected = collect(str(outbox))
    assert [file.name for file in collected.files] == ["ok.txt"]
    assert "'link', 'pipe', 'sub' not sent: only regular files" in collected.note


def test_an_outbox_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "passwd").write_text("root")
    (tmp_path / "outbox").symlink_to(elsewhere)
    collected = collect(str(tmp_path / "outbox"))
    assert collected.files == ()
    assert "could not be read" in collected.note


def test_bounds_count_and_bytes(tmp_path: Path) -> None:
    for name in "abcde":
        (tmp_path / name).write_bytes(bytes(10))
    (tmp_path / "huge").write_bytes(bytes(1000))
    collected = collect(str(tmp_path), max_files=3, max_bytes=25)
    assert [file.name for file in collected.files] == ["a", "b"]
    assert "'c', 'd', 'e' and 1 more not sent: a turn sends at most 25 bytes in all" in collected.note
    collected = collect(str(tmp_path), max_files=3, max_bytes=10_000)
    assert [file.name for file in collected.files] == ["a", "b", "c"]
    assert "'d', 'e', 'huge' not sent: a turn sends at most 3 files" in collected.note


def test_read_file_refuses_a_file_swapped_for_a_link(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("abc")
    (file,) = collect(str(tmp_path)).files
    assert read_file(file) == b"abc"
    with pytest.raises(OutboxError, match="over"):
        read_file(file, max_bytes=2)
    (tmp_path / "f").unlink()
    (tmp_path / "f").symlink_to(tmp_path / "g")
    (tmp_path / "g").write_text("abc")
    with pytest.raises(OutboxError, match="cannot be read"):
        read_file(file)
    (tmp_path / "f").unlink()
    (tmp_path / "f").write_text("abcd")
    with pytest.raises(OutboxError, match="changed"):
        read_file(file)


def test_remove_outbox_removes_the_turn_s_outbox_with_its_files(tmp_path: Path) -> None:
    files = TurnFiles(str(tmp_path), "turn-1")
    outbox = Path(files.outbox)
    assert outbox.parent == tmp_path / ".agent-bridge" / "outbox"
    (outbox / "f").write_text("x")
    files.remove_attachments()
    files.close()
    remove_outbox(str(outbox))
    assert left_in(tmp_path) == []


async def test_one_process_turns_that_never_start_their_agent_leave_no_turn_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    missing = bridge.Profile(command=[str(tmp_path / "no-such-agent")], cwd=str(work))
    fetching = bridge.Profile(command=["true"], cwd=str(work), attachments={"fetch": True})
    refused = bridge.Turn("look", attachments=[bridge.Attachment("file", "http://127.0.0.1:9/notes.txt")])
    with trio.fail_after(10):
        not_started = await bridge.run_turn(missing, bridge.Turn("hi"))  # its directory was made, then the start failed
        not_fetched = await bridge.run_turn(fetching, refused)  # made, then the fetch was refused
    assert not_started.outcome == "spawn_failed" and "no-such-agent" in not_started.error_reply
    assert not_fetched.outcome == "attachment_failed" and "loopback" in not_fetched.error
    assert left_in(work) == []


def test_an_agent_writes_two_files(make_agent, tmp_path: Path) -> None:
    profile = make_agent(TWO_FILES, cwd=str(tmp_path / "work"))
    (tmp_path / "work").mkdir()
    events: list[object] = []
    result = bridge.run_turn_sync(profile, bridge.Turn("make a report"), on_event=events.append)
    assert result.ok and result.reply == "done"
    assert [(file.name, file.size, file.media_type) for file in result.files] == [
        ("chart.png", 108, "image/png"),
        ("report.txt", 20, "text/plain"),
    ]
    assert Path(result.files[1].path).read_text() == "two lines\nof report\n"
    assert Path(result.files[0].path).parent.parent == tmp_path / "work" / ".agent-bridge" / "outbox"
    files = [event for event in events if isinstance(event, FileEvent)]
    assert files == list(result.files)
    assert events.index(files[-1]) == len(events) - 2  # the files come before the result
    assert result.to_dict()["files"][0] == {
        "name": "chart.png",
        "path": result.files[0].path,
        "size": 108,
        "media_type": "image/png",
    }


def test_a_turn_without_files_leaves_only_the_bridge_s_empty_directories(make_agent, tmp_path: Path) -> None:
    """The agent's `AGENT_OUTBOX` is an empty directory of the turn's own right under `.agent-bridge/outbox/`; after
    the turn `.agent-bridge/` holds the directories the bridge keeps (`attachments/` from the first turn that has
    some), empty but for the outbox kept for the next turn, empty, and the `.gitignore` made with it."""
    work = tmp_path / "work"
    work.mkdir()
    profile = make_agent(
        'import os; print(os.environ["AGENT_OUTBOX"], os.listdir(os.environ["AGENT_OUTBOX"]))',
        cwd=str(work),
        attachments={"fetch": True},
    )
    state = work / ".agent-bridge"
    SPARE_OUTBOXES.remove_all()  # none kept from other tests: this one's is the newest anyway

    def kept() -> list[tuple[str, list[str]]]:
        return sorted(
            (path.name, [spare_or(child.name) for child in path.iterdir()]) for path in state.iterdir() if path.is_dir()
        )

    def spare_or(name: str) -> str:
        spare = state / "outbox" / name
        return "spare" if name.startswith(".spare-") and not any(spare.iterdir()) else name

    result = bridge.run_turn_sync(profile, bridge.Turn("hi"))
    assert result.ok and result.files == ()
    assert re.fullmatch(re.escape(str(state / "outbox")) + r"/[\w-]+ \[\]", result.reply), result.reply
    assert kept() == [("outbox", ["spare"])]
    assert (state / ".gitignore").read_text() == "*\n"
    result = bridge.run_turn_sync(profile, bridge.Turn("hi", attachments=[bridge.Attachment("file", "data:,x")]))
    assert result.ok and result.files == ()
    assert re.fullmatch(re.escape(str(state / "outbox")) + r"/[\w-]+ \[\]", result.reply), result.reply
    assert kept() == [("attachments", []), ("outbox", ["spare"])]


def _outbox_kept(cwd: Path) -> Path:
    """The one spare outbox in `cwd`, empty."""
    (spare,) = (cwd / ".agent-bridge" / "outbox").iterdir()
    assert spare.name.startswith(".spare-") and not spare.is_symlink() and list(spare.iterdir()) == []
    return spare


def test_an_empty_outbox_is_kept_for_the_next_turn_in_its_directory(tmp_path: Path) -> None:
    SPARE_OUTBOXES.remove_all()
    first = TurnFiles(str(tmp_path), "t1", attachments=False)
    made = os.stat(first.outbox)
    assert first.remove_outbox_if_empty()
    spare = _outbox_kept(tmp_path)
    assert os.stat(spare).st_ino == made.st_ino and stat.S_IMODE(os.stat(spare).st_mode) == 0o700
    second = TurnFiles(str(tmp_path), "t2", attachments=False)  # takes it, under its own name
    assert os.stat(second.outbox).st_ino == made.st_ino and os.path.basename(second.outbox).startswith("t2-")
    assert os.listdir(tmp_path / ".agent-bridge" / "outbox") == [os.path.basename(second.outbox)]
    with open(os.path.join(second.outbox, "report.txt"), "w") as out:
        out.write("for the user")
    assert not second.remove_outbox_if_empty()  # a file to deliver: not kept, not removed
    assert os.listdir(second.outbox) == ["report.txt"]
    second.remove_outbox()
    assert os.listdir(tmp_path / ".agent-bridge" / "outbox") == []  # no spare for the next turn: it makes one
    third = TurnFiles(str(tmp_path), "t3", attachments=False)
    other = TurnFiles(str(tmp_path), "t4", attachments=False)
    assert third.remove_outbox_if_empty() and other.remove_outbox_if_empty()
    assert _outbox_kept(tmp_path).name  # one spare a directory: the other outbox was removed


def test_a_spare_outbox_is_taken_only_as_it_was_left(tmp_path: Path) -> None:
    """The agents own the working directory: whatever they make of the spare, the next turn's outbox is an empty
    directory of the bridge's own, mode 0o700, and nothing outside is touched."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret").write_text("not the bridge's")
    cwd = tmp_path / "cwd"
    cwd.mkdir()

    def spoiled(spoil: Callable[[Path], object]) -> str:
        left = TurnFiles(str(cwd), "left", attachments=False)
        assert left.remove_outbox_if_empty()
        spare = _outbox_kept(cwd)
        spoil(spare)
        taken = TurnFiles(str(cwd), "next", attachments=False)
        info = os.lstat(taken.outbox)
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and os.listdir(taken.outbox) == []
        assert not os.path.lexists(spare)
        assert os.listdir(cwd / ".agent-bridge" / "outbox") == [os.path.basename(taken.outbox)]
        taken.remove_outbox()
        return taken.outbox

    def swapped_for_a_symlink(spare: Path) -> None:
        spare.rmdir()
        spare.symlink_to(elsewhere)

    def swapped_for_another_directory(spare: Path) -> None:
        spare.rename(cwd / "moved")
        spare.mkdir(mode=0o755)
        (spare / "planted.txt").write_text("from another agent")

    SPARE_OUTBOXES.remove_all()
    spoiled(lambda spare: (spare / "planted.txt").write_text("from another agent"))
    spoiled(lambda spare: spare.chmod(0o777))
    spoiled(swapped_for_a_symlink)
    spoiled(swapped_for_another_directory)
    spoiled(lambda spare: spare.rmdir())
    spoiled(lambda spare: (spare.rmdir(), spare.write_text("a file")))
    assert sorted(os.listdir(elsewhere)) == ["secret"] and (elsewhere / "secret").read_text() == "not the bridge's"


def test_a_process_keeps_spares_in_at_most_64_directories_the_least_recently_used_losing_theirs(
    tmp_path: Path,
) -> None:
    SPARE_OUTBOXES.remove_all()
    directories = [tmp_path / str(index) for index in range(MAX_SPARES + 1)]
    for directory in directories:
        directory.mkdir()
        assert TurnFiles(str(directory), "t", attachments=False).remove_outbox_if_empty()
    assert os.listdir(directories[0] / ".agent-bridge" / "outbox") == []
    assert all(_outbox_kept(directory) for directory in directories[1:])
    taken = TurnFiles(str(directories[1]), "t", attachments=False)  # the oldest is used: the next oldest goes
    assert taken.remove_outbox_if_empty()
    assert TurnFiles(str(directories[0]), "t", attachments=False).remove_outbox_if_empty()
    assert _outbox_kept(directories[1]) and _outbox_kept(directories[0])
    assert os.listdir(directories[2] / ".agent-bridge" / "outbox") == []
    SPARE_OUTBOXES.remove_all()
    assert all(os.listdir(directory / ".agent-bridge" / "outbox") == [] for directory in directories)


def test_a_spare_left_by_another_process_is_not_taken_and_a_process_removes_its_own_at_exit(tmp_path: Path) -> None:
    (tmp_path / ".agent-bridge" / "outbox" / ".spare-0badc0de").mkdir(parents=True, mode=0o700)  # a kill -9'd one's
    script = (
        "import sys; from bridge.files.turn_directory import TurnFiles\n"
        "files = TurnFiles(sys.argv[1], 't1', attachments=False)\n"
        "assert files.remove_outbox_if_empty()\n"
        "import os; print(sorted(os.listdir(sys.argv[1] + '/.agent-bridge/outbox')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True)
    kept = ast.literal_eval(done.stdout)
    assert len(kept) == 2 and ".spare-0badc0de" in kept  # its own beside the other one's, while it runs
    assert os.listdir(tmp_path / ".agent-bridge" / "outbox") == [".spare-0badc0de"]  # its own removed at exit
    SPARE_OUTBOXES.remove_all()
    files = TurnFiles(str(tmp_path), "t2", attachments=False)
    assert sorted(os.listdir(tmp_path / ".agent-bridge" / "outbox")) == [
        ".spare-0badc0de",
        os.path.basename(files.outbox),
    ]
    files.remove_outbox()


def test_an_outbox_with_nothing_to_send_goes_with_what_is_in_it(make_agent, tmp_path: Path) -> None:
    """Not what a link in it points at, though."""
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "mine.txt").write_text("the user's")
    profile = make_agent(
        f"""
        import os, pathlib
        outbox = pathlib.Path(os.environ["AGENT_OUTBOX"])
        (outbox / "sub").mkdir()
        (outbox / "sub" / "deep.txt").write_text("not sent")
        (outbox / "mine.txt").symlink_to({str(tmp_path / "mine.txt")!r})
        print("done")
        """,
        cwd=str(work),
    )
    result = bridge.run_turn_sync(profile, bridge.Turn("hi"))
    assert result.ok and result.files == () and "'mine.txt', 'sub' not sent" in result.files_note
    assert left_in(work) == []
    assert (tmp_path / "mine.txt").read_text() == "the user's"


def test_a_huge_file_is_dropped_with_a_note(make_agent, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    profile = make_agent(
        """
        import os, pathlib
        outbox = pathlib.Path(os.environ["AGENT_OUTBOX"])
        (outbox / "small.txt").write_text("small")
        (outbox / "video.mp4").write_bytes(bytes(2_000_000))
        os.symlink("/etc/passwd", outbox / "passwd")
        """,
        cwd=str(tmp_path / "work"),
        outbox_max_bytes=1_000_000,
    )
    events: list[object] = []
    result = bridge.run_turn_sync(profile, bridge.Turn("hi"), on_event=events.append)
    assert [file.name for file in result.files] == ["small.txt"]
    assert "'video.mp4' not sent: a turn sends at most 976.6 KiB in all" in result.files_note
    assert "'passwd' not sent: only regular files" in result.files_note
    notices = [event for event in events if isinstance(event, bridge.ActivityEvent) and event.activity == "notice"]
    assert [notice.text for notice in notices] == [result.files_note]


def test_a_turn_directory_that_cannot_be_made_costs_the_outbox_not_the_turn(make_agent, tmp_path: Path) -> None:
    """The bridge writes nothing through a link the agent planted (nor in a working directory it may not write to,
    serve started in /, say: the same refusal), and the turn still runs, without an outbox — unless it has
    attachments to fetch, which need the directory (URLs passed through need none)."""
    agent = "import os; print('outbox:', os.environ.get('AGENT_OUTBOX', 'none'))"
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "work" / ".agent-bridge").symlink_to(tmp_path / "elsewhere")
    result = bridge.run_turn_sync(make_agent(agent, cwd=str(tmp_path / "work")), bridge.Turn("hi"))
    assert (result.ok, result.reply) == (True, "outbox: none")
    assert list((tmp_path / "elsewhere").iterdir()) == []
    attached = bridge.Turn("hi", attachments=[bridge.Attachment("file", "data:,x")])
    fetching = make_agent(agent, cwd=str(tmp_path / "work"), attachments={"fetch": True})
    result = bridge.run_turn_sync(fetching, attached)
    assert result.outcome == "spawn_failed" and "the turn's directory cannot be made" in result.error_reply  # no room
    # An IP literal the address rule refuses: were it fetched, the turn would fail before any packet left.
    passed = bridge.Turn("hi", attachments=[bridge.Attachment("file", "http://10.255.255.1/x")])
    result = bridge.run_turn_sync(make_agent(agent, cwd=str(tmp_path / "work")), passed)
    assert (result.ok, result.reply) == (True, "outbox: none"), result.error


def test_a_cancelled_turn_leaves_no_outbox(make_agent, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    profile = make_agent(
        """
        import os, pathlib, time
        (pathlib.Path(os.environ["AGENT_OUTBOX"]) / "half.txt").write_text("half")
        print("AGENT_PARTIAL: wrote", flush=True)
        time.sleep(30)
        """,
        cwd=str(tmp_path / "work"),
        kill_grace_secs=0.2,
    )

    async def main() -> None:
        async with bridge.open_turn(profile, bridge.Turn("hi")) as stream:
            async for event in stream:
                if isinstance(event, bridge.PartialEvent):
                    break

    trio.run(main)
    assert left_in(tmp_path / "work") == []


def test_run_json_shows_the_files_before_the_result_and_on_it(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    profile = agent_profile(tmp_path, TWO_FILES, cwd=str(work))
    done = cli("run", str(profile), "x", "--json")
    events = ndjson(done.stdout)
    assert [event["event"] for event in events] == ["file", "file", "result"]
    assert [event["name"] for event in events[:2]] == ["chart.png", "report.txt"]
    assert events[2]["files"] == [
        {key: value for key, value in event.items() if key != "event"} for event in events[:2]
    ]
    assert Path(events[1]["path"]).read_text() == "two lines\nof report\n"  # run leaves them for the user


def test_run_names_each_file_on_a_line_of_its_own(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    profile = agent_profile(tmp_path, TWO_FILES, cwd=str(work))
    done = cli("run", str(profile), "x")
    assert done.stdout == "done\n"
    lines = [line for line in done.stderr.splitlines() if line.startswith("file: ")]
    assert len(lines) == 2
    assert re.search(r"/\.agent-bridge/outbox/[\w-]+/chart\.png \(108 bytes, image/png\)$", lines[0])


def files_lab(tmp_path: Path) -> Lab:
    lab = Lab(tmp_path)
    (tmp_path / "work").mkdir()
    agent_profile(lab.profiles, TWO_FILES, name="maker", cwd=str(tmp_path / "work"))
    return lab


@asynccontextmanager
async def serving(lab: Lab, file_ttl: float = 600) -> AsyncIterator[Client]:
    host = bridge.open_host(lab.profiles, state=lab.state)
    client_sends, server_receives = trio.testing.memory_stream_one_way_pair()
    server_sends, client_receives = trio.testing.memory_stream_one_way_pair()
    server = Server(host, server_receives, server_sends, file_ttl=file_ttl)
    ended = trio.Event()
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            async with host:
                await server.run()
            ended.set()

        nursery.start_soon(run)
        client = Client(client_sends, client_receives)
        yield client
        await client.close()
        with trio.fail_after(10):
            await ended.wait()  # serve ends at EOF


def maker_turn(request_id: str, **fields: Any) -> dict[str, Any]:
    return {"type": "turn", "id": request_id, "profile": "maker", "conversation": request_id, "message": "go", **fields}


async def test_serve_sends_each_file_by_path_before_the_result_and_deletes_it_on_ack(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    async with serving(lab) as client:
        await client.send(maker_turn("t1"))
        responses = await client.until("result", "t1")
        assert [response["type"] for response in responses] == ["accepted", "file", "file", "result"]
        chart, report = responses[1], responses[2]
        assert (chart["name"], chart["size"], chart["media_type"], "data" in chart) == (
            "chart.png",
            108,
            "image/png",
            False,
        )
        assert Path(report["path"]).read_text() == "two lines\nof report\n"
        assert [file["name"] for file in responses[3]["files"]] == ["chart.png", "report.txt"]
        await client.send({"type": "ack_file", "id": "t1", "file": "report.txt"})
        await client.send({"type": "ack_file", "id": "t1", "file": "report.txt"})
        error = await client.receive()
        assert (error["type"], error["code"], error["id"]) == ("error", "unknown_file", "t1")
        assert not Path(report["path"]).exists() and Path(chart["path"]).exists()
        await client.send({"type": "ack_file", "id": "t1", "file": "chart.png"})
        await client.send({"type": "stats", "id": "s"})
        await client.until("stats", "s")
        assert left_in(tmp_path / "work") == []  # the last ack took the turn's outbox with it


async def test_serve_inlines_files_below_the_size_the_turn_asks_for(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    async with serving(lab) as client:
        await client.send(maker_turn("t1", inline_files_max_bytes=50))
        responses = await client.until("result", "t1")
        chart, report = responses[1], responses[2]
        assert "data" not in chart and Path(chart["path"]).exists()
        assert base64.b64decode(report["data"]) == b"two lines\nof report\n"
        assert not Path(report["path"]).exists()  # sent whole: nothing to acknowledge
        await client.send(maker_turn("t2", inline_files_max_bytes=-1))
        error = await client.receive()
        assert error["code"] == "invalid_request" and "inline_files_max_bytes" in error["message"]


async def test_serve_deletes_files_nobody_acknowledged_in_time_and_at_its_end(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    async with serving(lab, file_ttl=0.3) as client:
        await client.send(maker_turn("t1"))
        responses = await client.until("result", "t1")
        await trio.sleep(0.6)
        assert not Path(responses[1]["path"]).exists()
        assert left_in(tmp_path / "work") == []
        await client.send(maker_turn("t2"))
        responses = await client.until("result", "t2")
        assert Path(responses[1]["path"]).exists()
    assert left_in(tmp_path / "work") == []  # the bot went away: serve took its files with it


async def test_the_host_and_a_turn_stream_see_the_files(tmp_path: Path) -> None:
    lab = files_lab(tmp_path)
    seen: list[object] = []
    async with bridge.open_host(lab.profiles, state=lab.state) as host:
        result = await host.submit("maker", "c", bridge.Turn("go"), on_event=seen.append)
    assert [file.name for file in result.files] == ["chart.png", "report.txt"]
    assert [event for event in seen if isinstance(event, FileEvent)] == list(result.files)
    profile = bridge.load_profile(lab.profiles / "maker.yaml")
    async with bridge.open_turn(profile, bridge.Turn("go")) as stream:
        events = [event async for event in stream]
    assert [type(event).__name__ for event in events] == ["FileEvent", "FileEvent", "TurnResult"]
    assert stream.result.files == tuple(events[:2])


MANY_FILES = """
import os
outbox = os.environ["AGENT_OUTBOX"]
for number in range(100_000):
    os.close(os.open(os.path.join(outbox, f"{number:06d}-" + "x" * 40), os.O_CREAT | os.O_WRONLY, 0o600))
print("done")
"""
# `agent-bridge run PROFILE hi --json` for each profile: its result and the peak RSS of the processes run so far.
RUN_MEASURED = """
import json, resource, subprocess, sys
for profile in sys.argv[2:]:
    done = subprocess.run([sys.argv[1], "run", profile, "hi", "--json"], stdout=subprocess.PIPE, check=True)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"result": json.loads(done.stdout.splitlines()[-1]), "peak_kib": peak_kib}))
"""


def test_an_outbox_of_100_000_files_costs_the_bridge_no_memory_for_each(tmp_path: Path) -> None:
    """An agent may leave any number of files: the bridge looks at a bounded number of entries (sorting them all
    cost it ~80 MiB more for these, and a listing that held up every other turn), sends files of those and says
    the rest were not looked at."""
    work = tmp_path / "work"
    work.mkdir()
    echo = agent_profile(tmp_path, "print('hi')", "echo", cwd=str(work))
    many = agent_profile(tmp_path, MANY_FILES, "many", cwd=str(work))
    cli = os.path.join(os.path.dirname(sys.executable), "agent-bridge")
    done = subprocess.run(
        [sys.executable, "-c", RUN_MEASURED, cli, str(echo), str(many)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    baseline, flood = map(json.loads, done.stdout.splitlines())
    assert flood["result"]["reply"] == "done" and len(flood["result"]["files"]) == 20
    assert flood["peak_kib"] < baseline["peak_kib"] + 16 * 1024, (baseline["peak_kib"], flood["peak_kib"])
    assert "the outbox holds over 10000 entries: only 10000 of them were looked at" in flood["result"]["files_note"]


def test_an_outbox_holding_a_tree_3000_directories_deep_goes_with_it(make_agent, tmp_path: Path) -> None:
    """Removing it takes no recursion (Python's stack ends near 1000 levels: the turn failed, the tree stayed) and
    a bounded number of descriptors, whatever the depth."""
    work = tmp_path / "work"
    work.mkdir()
    profile = make_agent(
        """
        import os
        directory = os.open(os.environ["AGENT_OUTBOX"], os.O_RDONLY)
        for _ in range(3000):
            os.mkdir("d", dir_fd=directory)
            os.symlink("/", "link", dir_fd=directory)
            inner = os.open("d", os.O_RDONLY, dir_fd=directory)
            os.close(directory)
            directory = inner
        open(f"/proc/self/fd/{directory}/deepest.txt", "w").close()
        print("done")
        """,
        cwd=str(work),
    )
    try:
        result = bridge.run_turn_sync(profile, bridge.Turn("hi"))
        assert result.ok and result.files == () and "'d', 'link' not sent" in result.files_note
        assert left_in(work) == []
    finally:  # pytest's own clean-up of its temporary directories is recursive too
        subprocess.run(["rm", "-rf", str(work)], check=True)
