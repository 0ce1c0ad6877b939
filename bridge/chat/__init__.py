"""The chat kit: connectors that carry turns to chat platforms (docs/chat.md).

The delivery kit (`runtime`, `inbox`, `botlock`) is the same for every platform; a connector implements
`platform.Platform`. Imported only by `agent-bridge connect`: nothing else in bridge imports this package.
"""
