-- Commit one record, keep the best and count the measurement, atomically.
-- KEYS[1] records hash (candidate -> record JSON)
-- KEYS[2] best hash (cand, us, record)
-- KEYS[3] job-measured hash (workload key -> new records), or "" for none
-- KEYS[4] job-counts hash ("<workload key>|<counter>" -> n), or "" for none
-- KEYS[5] unverified set (candidates whose stored record no phone of the farm measured)
-- ARGV[1] candidate hash
-- ARGV[2] stored record JSON
-- ARGV[3] run time in microseconds, "" for a failed kernel
-- ARGV[4] workload key (the field of KEYS[3], the prefix of KEYS[4]'s fields)
-- ARGV[5] "1" when the record was measured on a phone (counted in KEYS[4])
-- ARGV[6] "1" when the record is verified (measured by a phone of the farm), "0" imported
-- ARGV[7] the TVM version the record was measured with ("" unknown)
-- Returns 1 when the record is new (or replaced an unverified one), 0 when this candidate
-- was already stored. A run time that is not a finite number > 0 is refused (an error).
local us = nil
if ARGV[3] ~= '' then
  us = tonumber(ARGV[3])
  if (not us) or us ~= us or us <= 0 or us >= 1e16 then
    return redis.error_reply('run time ' .. ARGV[3] .. ' us is not a finite number > 0: refused')
  end
end
local verified = ARGV[6] == '1'
local new = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
local replaced = false
if new == 0 and verified then
  -- a phone of the farm measured a candidate stored unverified (imported) or measured with
  -- another TVM version: this measurement replaces it
  local old_ok, old = pcall(cjson.decode, redis.call('HGET', KEYS[1], ARGV[1]))
  local untrusted = redis.call('SREM', KEYS[5], ARGV[1]) == 1
  if (not untrusted) and old_ok and type(old) == 'table' then
    untrusted = old.verified == false
      or (ARGV[7] ~= '' and type(old.tvm) == 'string' and old.tvm ~= '' and old.tvm ~= ARGV[7])
  end
  if untrusted then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
    new = 1
    replaced = true
  end
end
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
if not verified then
  redis.call('SADD', KEYS[5], ARGV[1])
  return 1  -- never the best before a phone of the farm measured it
end
if KEYS[3] ~= '' then
  redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
end
if replaced and redis.call('HGET', KEYS[2], 'cand') == ARGV[1] then
  recompute_best(KEYS[1], KEYS[2])
elseif us then
  local cur = redis.call('HGET', KEYS[2], 'us')
  if (not cur) or us < tonumber(cur) then
    redis.call('HSET', KEYS[2], 'cand', ARGV[1], 'us', ARGV[3], 'record', ARGV[2])
  end
end
return 1
