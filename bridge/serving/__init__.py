"""The doors' protocols over one host: serve's (shared by `serve` on stdin/stdout and the network door), ACP's
(`agent-bridge acp`, for editors) and MCP's (`agent-bridge mcp`, every profile a tool).

- `requests`: the requests a client of serve may send, checked, and the error codes;
- `session`: one client's requests handled on a host (`ClientSession`, `Tenant`);
- `output`: one client's responses, written whole and in order;
- `file_delivery`: the files agents leave, offered and deleted once taken;
- `acp_protocol`: `AcpAgentSide`, the agent side of ACP for one editor (pure: lines and turn events in, actions
  out); `acp`: `AcpDoor`, which carries those actions out on a host under trio, and `serve_acp_stdio`
  (docs/editors.md says what an editor gets and what it does not);
- `mcp_tools`: a profile as an MCP tool, a call's arguments as a turn, a result as MCP content (pure); `mcp`:
  `McpDoor`, the MCP SDK's low-level server whose calls run as turns on a host, and its stdio transport
  (docs/mcp.md). The `mcp` extra's SDK is imported only by `mcp` (and `network.mcp`), only when `agent-bridge mcp`
  runs.

The same MCP door over Streamable HTTP, with the network door's tokens and loopback rule, is `network.mcp`.
"""
