-- Remove the batch a drainer read from the spool and wrote to the archive, atomically, only
-- while it holds the drain lease and the spool still begins with that batch; the batch's
-- unreadable items move to the dead-letter list (farm/store/spool.py).
-- KEYS[1] spool list; KEYS[2] the drain lease; KEYS[3] dead-letter list
-- ARGV[1] the drainer (the lease's owner); ARGV[2] items in the batch; ARGV[3] their digest:
-- sha1 of the concatenated sha1 (hex) of each item; ARGV[4..] positions (from 0) of the
-- batch's unreadable items
-- Returns 1 when removed; 0 when the lease is not the drainer's; -1 when the spool's head is
-- no longer the batch (another drainer removed it). Nothing is removed unless 1.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
local n = tonumber(ARGV[2])
local items = redis.call('LRANGE', KEYS[1], 0, n - 1)
if #items ~= n then
  return -1
end
local parts = {}
for i, item in ipairs(items) do
  parts[i] = redis.sha1hex(item)
end
if redis.sha1hex(table.concat(parts)) ~= ARGV[3] then
  return -1
end
for i = 4, #ARGV do
  redis.call('RPUSH', KEYS[3], items[tonumber(ARGV[i]) + 1])
end
redis.call('LTRIM', KEYS[1], n, -1)
return 1
