"""The store on Redis: one store (store.py: `RedisStore`, the backend's `RecordStore`) made of
parts, one per contract, that share its one connection (connection.py: the clients, the Lua
scripts, the URL): the records (records.py, with the Lua scripts that keep the best beside
it), the spool to the archive (spool.py), the jobs (jobs.py), coordination (coordination.py),
the hosts (hosts.py), the phones' ledger (phones.py), the server's health (health.py); how a
URL becomes a client (url.py) and redis-py's errors as the farm's (errors.py)."""
