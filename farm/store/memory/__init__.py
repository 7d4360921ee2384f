"""The store in memory (unit tests, dry runs; one process): one store (store.py:
`MemoryStore`) that keeps records, jobs, coordination and hosts itself and composes two parts,
the spool (spool.py) and the phones' ledger (phones.py), with the Redis store's semantics
(the same contract tests run on both)."""
