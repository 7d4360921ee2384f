-- Shared by keep_best.lua and remove_records.lua (prepended to both by redis_store.py).
-- The best of a workload: the verified valid record with the least run time.
local function is_best_candidate(rec)
  return rec.error_class == cjson.null and type(rec.run_us) == 'number'
    and rec.verified ~= false
end

-- Scan every record and rewrite the best hash (after the best was replaced or removed).
local function recompute_best(records_key, best_key)
  redis.call('DEL', best_key)
  local all = redis.call('HGETALL', records_key)
  local best_cand, best_us, best_raw = nil, nil, nil
  for i = 1, #all, 2 do
    local ok, rec = pcall(cjson.decode, all[i + 1])
    if ok and type(rec) == 'table' and is_best_candidate(rec)
        and (best_us == nil or rec.run_us < best_us) then
      best_cand, best_us, best_raw = all[i], rec.run_us, all[i + 1]
    end
  end
  if best_cand then
    redis.call('HSET', best_key, 'cand', best_cand, 'us', tostring(best_us), 'record', best_raw)
  end
end
