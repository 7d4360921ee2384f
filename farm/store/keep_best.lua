-- Commit one measured record, keep the best and count the measurement, atomically.
-- KEYS[1] records hash (candidate -> record JSON)
-- KEYS[2] best hash (cand, us, record)
-- KEYS[3] job-measured hash (workload key -> new records), or "" for none
-- KEYS[4] job-counts hash ("<workload key>|<counter>" -> n), or "" for none
-- ARGV[1] candidate hash
-- ARGV[2] stored record JSON
-- ARGV[3] run time in microseconds, "" for a failed kernel
-- ARGV[4] workload key (the field of KEYS[3], the prefix of KEYS[4]'s fields)
-- ARGV[5] "1" when the record was measured on a phone (counted in KEYS[4])
-- Returns 1 when the record is new, 0 when this candidate was already stored.
local new = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if KEYS[4] ~= '' and ARGV[5] == '1' then
  redis.call('HINCRBY', KEYS[4], ARGV[4] .. '|measurements', 1)
  if new == 1 then
    redis.call('HINCRBY', KEYS[4], ARGV[4] .. '|new', 1)
  else
    redis.call('HINCRBY', KEYS[4], ARGV[4] .. '|duplicates', 1)
  end
end
if new == 0 then
  return 0
end
if KEYS[3] ~= '' then
  redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
end
if ARGV[3] ~= '' then
  local us = tonumber(ARGV[3])
  local cur = redis.call('HGET', KEYS[2], 'us')
  if (not cur) or us < tonumber(cur) then
    redis.call('HSET', KEYS[2], 'cand', ARGV[1], 'us', ARGV[3], 'record', ARGV[2])
  end
end
return 1
