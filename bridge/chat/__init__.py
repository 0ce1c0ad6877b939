"""The chat kit: connectors that carry turns to chat platforms (docs/chat.md)."""
