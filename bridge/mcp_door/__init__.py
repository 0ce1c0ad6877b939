"""The MCP door (`agent-bridge mcp`, docs/mcp.md): every profile a tool for other agents.

- `tools`: a profile as a tool, a call's arguments as a turn, a result as MCP content (pure);
- `server`: `McpDoor`, the SDK's low-level server whose calls run as turns on a host, and its stdio transport;
- `http`: the same at `/mcp` over Streamable HTTP, with the network door's tokens and loopback rule.

The `mcp` extra's SDK is imported only by `server` and `http`, and only when `agent-bridge mcp` runs.
"""
