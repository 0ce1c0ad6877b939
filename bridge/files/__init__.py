"""A turn's files: the attachments a turn brings, the files it hands back, and the files an agent asks for.

It owns the rules for fetching an attachment (`fetch_policy`), the fetching itself (`attachments`), the turn's
directory under `.agent-bridge/` (`turn_directory`), the files a turn leaves for the user (`outbox`) and the files a
warm agent asks the bridge to read or write (`agent_requests`).

It may import the bottom modules (`errors`, `log`, `turn`), `dialects`, `confinement` and `profile`; never the
engine, which uses it, nor `host`, `serving`, `network`, `chat` or `cli`.
"""
