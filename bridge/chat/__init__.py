"""Chat platforms: the delivery kit and its connectors (`agent-bridge connect`)."""
