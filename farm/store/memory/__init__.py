"""The store in memory (unit tests, dry runs; one process): the spool (spool.py), the phones'
ledger (phones.py) and the store over them (store.py: `MemoryStore`), with the Redis
store's semantics (the same contract tests run on both)."""
