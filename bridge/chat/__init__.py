"""Chat platforms built in: the delivery kit (`runtime`, `inbox`) and its connectors (`platform` says what one is).

Imported only by `agent-bridge connect`: nothing else in bridge imports this package.
"""
