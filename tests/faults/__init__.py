"""Faults, soak and stress: servers killed, paused and cut off; probed defects."""
