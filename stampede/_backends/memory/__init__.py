"""The embedded family: everything in this process's memory (cachetools)."""
