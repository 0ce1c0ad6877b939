"""`agent-bridge acp`: a profile as an Agent Client Protocol agent, for editors, on stdin/stdout.

- `protocol`: `AcpAgentSide`, the agent side of ACP for one editor (pure: lines and turn events in, actions out);
- `runner`: `AcpDoor`, which carries those actions out on a host under trio, and `serve_acp_stdio`.

docs/editors.md says what an editor gets and what it does not.
"""
