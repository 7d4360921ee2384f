"""The store on Redis: the records (records.py, with the Lua scripts that keep the best
beside it), the spool to the archive (spool.py), the phones' ledger (phones.py), one store
over them (store.py: `RedisStore`), and how a URL becomes a client (url.py)."""
