"""Confinement: what keeps an agent's process inside its walls and what the bridge leaves behind when it ends.

It owns the process handle and its spawner (`process`), the keeper that kills an agent's process group should
the bridge die (`keeper`), cgroups (`cgroups`), the resource limits (`limits`), the sandbox's bwrap argv
(`sandbox`) and the lookup of the programs put in front of an agent, bwrap and prlimit (`programs`).

It may import the bottom modules (`errors`, `log`) and, for the process handle only, the engine's launch plan
(`engine.launch.LaunchPlan`); never `host`, `serving`, `network`, `chat` or `cli`.
"""
