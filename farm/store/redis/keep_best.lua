-- Commit one record, keep the best, keep the K fastest whole and count, atomically.
-- KEYS[1] records hash (candidate -> entry: farm/store/packing.py)
-- KEYS[2] best hash (cand, us, record: the whole record, packed)
-- KEYS[3] job-measured hash (workload key -> new records), or "" for none
-- KEYS[4] job-counts hash ("<workload key>|<counter>" -> n), or "" for none
-- KEYS[5] unverified set (candidates whose stored record no phone of the farm measured)
-- KEYS[6] hot hash (candidate -> whole record, packed): the K fastest, failures last
-- KEYS[7] spool list ("<workload key>\n<packed record>": leaving Redis for the archive)
-- ARGV[1] candidate hash
-- ARGV[2] its entry
-- ARGV[3] the whole record, packed
-- ARGV[4] run time in microseconds, "" for a failed kernel
-- ARGV[5] workload key (the field of KEYS[3], the prefix of KEYS[4]'s fields)
-- ARGV[6] "1" when the record was measured on a phone (counted in KEYS[4])
-- ARGV[7] "1" when the record is verified (measured by a phone of the farm), "0" imported
-- ARGV[8] the TVM version the record was measured with ("" unknown)
-- ARGV[9] K: whole records kept in Redis for this workload
-- KEYS[8] this commit's attempt key (the same when the client sends the commit again): what
--         it answered, or "" for none
-- ARGV[10] seconds the attempt key is kept
-- Returns 1 when the record is new (or replaced an unverified one), 0 when this candidate
-- was already stored; a commit sent again (its attempt id known) returns what the first
-- did and changes nothing. A run time that is not a finite number > 0 is refused (an error).
local us = nil
if ARGV[4] ~= '' then
  us = tonumber(ARGV[4])
  if (not us) or us ~= us or us <= 0 or us >= 1e16 then
    return redis.error_reply('run time ' .. ARGV[4] .. ' us is not a finite number > 0: refused')
  end
end
if KEYS[8] ~= '' then
  local answered = redis.call('GET', KEYS[8])
  if answered then
    return tonumber(answered)
  end
end

local function commit()
  local verified = ARGV[7] == '1'
  local new = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
  local replaced = false
  if new == 0 and verified then
    -- a phone of the farm measured a candidate stored unverified (imported) or measured with
    -- another TVM version: this measurement replaces it
    local untrusted = redis.call('SREM', KEYS[5], ARGV[1]) == 1
    if not untrusted then
      local _, _, old_verified, old_tvm = entry_fields(redis.call('HGET', KEYS[1], ARGV[1]))
      untrusted = (not old_verified) or (ARGV[8] ~= '' and old_tvm ~= '' and old_tvm ~= ARGV[8])
    end
    if untrusted then
      redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
      new = 1
      replaced = true
    end
  end
  if KEYS[4] ~= '' and ARGV[6] == '1' then
    redis.call('HINCRBY', KEYS[4], ARGV[5] .. '|measurements', 1)
    if new == 1 then
      redis.call('HINCRBY', KEYS[4], ARGV[5] .. '|new', 1)
    else
      redis.call('HINCRBY', KEYS[4], ARGV[5] .. '|duplicates', 1)
    end
  end
  if new == 0 then
    return 0
  end
  -- the whole record: kept hot while among the K fastest (failures leave first), else archived
  redis.call('HSET', KEYS[6], ARGV[1], ARGV[3])
  if redis.call('HLEN', KEYS[6]) > tonumber(ARGV[9]) then
    evict_slowest(KEYS[1], KEYS[6], KEYS[7], ARGV[5])
  end
  if not verified then
    redis.call('SADD', KEYS[5], ARGV[1])
    return 1  -- never the best before a phone of the farm measured it
  end
  if KEYS[3] ~= '' then
    redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
  end
  if replaced and redis.call('HGET', KEYS[2], 'cand') == ARGV[1] then
    recompute_best(KEYS[1], KEYS[2], KEYS[6])
  elseif us then
    local cur = redis.call('HGET', KEYS[2], 'us')
    if (not cur) or us < tonumber(cur) then
      redis.call('HSET', KEYS[2], 'cand', ARGV[1], 'us', ARGV[4], 'record', ARGV[3])
    end
  end
  return 1
end

local answer = commit()
if KEYS[8] ~= '' then
  redis.call('SET', KEYS[8], answer, 'EX', tonumber(ARGV[10]))
end
return answer
