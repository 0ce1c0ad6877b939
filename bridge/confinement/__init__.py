"""Confinement: what keeps an agent's process inside its walls, and what the bridge leaves behind when it ends.

It owns the process handle (`process`), its spawner (`spawner`), the messages of a failed spawn
(`spawn_failures`), the sweeping of orphans (`orphans`), the keeper that kills an agent's process group should
the bridge die (`keeper`), cgroups (`cgroups`), the resource limits (`limits`), the OS's limit on one exec
argument (`exec_limits`), the sandbox's bwrap argv (`sandbox`) and the lookup of the programs put in front of an
agent, bwrap and prlimit (`programs`).

It may import only the bottom modules (`errors`, `log`, `turn`): the profile, the files and the engine build on
it. A spawn reads what it needs of the engine's launch plan through `spawner.SpawnPlan`.
"""
