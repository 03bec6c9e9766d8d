"""The pure decisions and rules, step by step, without a server."""
