"""The engine: what runs one turn of an agent, from its launch plan to its result.

It owns the launch plan (`launch`), the driver of an agent process (`driver`), the loop over a turn's events
(`loop`), the turn's rules and result (`result`), the questions an agent asks (`questions`), the end of a turn's
files (`hand_out`), the one set-up of a turn's files (`turn_setup`), the one-process turn (`one_process`), the
long-lived agents (`warm_agents`) and the public run functions (`run`: `run_turn`, `open_turn`).

It may import the bottom modules (`errors`, `log`, `permissions`, `turn`, `version`), `dialects`, `confinement`,
`profile` and `files`; never `host`, `serving`, `network`, `chat` or `cli`. Inside it each module has its floor
(`tests/test_layout.py`, `ENGINE_FLOORS`): `launch` and `questions` lowest, `run` highest.
"""
