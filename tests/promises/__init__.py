"""The promises, over every backend: one load, bounded waits, locks, freshness, the store contract."""
