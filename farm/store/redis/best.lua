-- Shared by keep_best.lua and remove_records.lua (prepended to both by connection.py).
-- A records hash maps a candidate to its entry, "<us>|<failure class>|<1 verified>|<tvm>|<t>"
-- (farm/store/packing.py), or, in a store written before that layout, its whole JSON record.

-- us (nil when failed), failure class ("" when valid), verified, tvm version of an entry
local function entry_fields(text)
  if string.sub(text, 1, 1) == '{' then
    local ok, rec = pcall(cjson.decode, text)
    if not ok or type(rec) ~= 'table' then
      return nil, 'corrupt', false, ''
    end
    local us = nil
    if rec.error_class == cjson.null and type(rec.run_us) == 'number' then
      us = rec.run_us
    end
    local cls = ''
    if type(rec.error_class) == 'string' then cls = rec.error_class end
    local tvm = ''
    if type(rec.tvm) == 'string' then tvm = rec.tvm end
    return us, cls, rec.verified ~= false, tvm
  end
  local us, cls, verified, tvm = string.match(text, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|')
  return tonumber(us), cls or 'corrupt', verified == '1', tvm or ''
end

-- The slowest whole record of the hot hash (a failure first; ties: the greater candidate)
-- leaves it for the spool ("<workload key>\n<packed record>"), on its way to the archive.
local function evict_slowest(records_key, hot_key, spool_key, wk)
  local cands = redis.call('HKEYS', hot_key)
  local entries = redis.call('HMGET', records_key, unpack(cands))
  local worst, worst_score = nil, nil
  for i, cand in ipairs(cands) do
    local score = 1e18
    if entries[i] then
      local us, cls = entry_fields(entries[i])
      if us and cls == '' then score = us end
    end
    if worst == nil or score > worst_score or (score == worst_score and cand > worst) then
      worst, worst_score = cand, score
    end
  end
  local whole = redis.call('HGET', hot_key, worst)
  redis.call('HDEL', hot_key, worst)
  redis.call('RPUSH', spool_key, wk .. '\n' .. whole)
end

-- Scan every entry and rewrite the best hash (after the best was replaced or removed). Its
-- whole record comes from the hot records (or the entry itself, in the layout before); a
-- best whose whole record is in the archive only is kept as cand and us.
local function recompute_best(records_key, best_key, full_key)
  redis.call('DEL', best_key)
  local all = redis.call('HGETALL', records_key)
  local best_cand, best_us = nil, nil
  for i = 1, #all, 2 do
    local us, cls, verified = entry_fields(all[i + 1])
    if us and cls == '' and verified and (best_us == nil or us < best_us) then
      best_cand, best_us = all[i], us
    end
  end
  if best_cand then
    local whole = redis.call('HGET', full_key, best_cand)
    if not whole then
      local entry = redis.call('HGET', records_key, best_cand)
      if string.sub(entry, 1, 1) == '{' then whole = entry end
    end
    redis.call('HSET', best_key, 'cand', best_cand, 'us', tostring(best_us))
    if whole then redis.call('HSET', best_key, 'record', whole) end
  end
end
