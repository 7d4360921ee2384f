-- Delete records of one workload; recompute the best when it was one of them (atomic).
-- KEYS[1] records hash; KEYS[2] best hash; KEYS[3] unverified set; KEYS[4] device-lost hash;
-- KEYS[5] hot hash
-- ARGV candidate hashes. Returns how many records were deleted.
local removed = 0
local best = redis.call('HGET', KEYS[2], 'cand')
local best_gone = false
for _, cand in ipairs(ARGV) do
  removed = removed + redis.call('HDEL', KEYS[1], cand)
  redis.call('SREM', KEYS[3], cand)
  redis.call('HDEL', KEYS[4], cand)
  redis.call('HDEL', KEYS[5], cand)
  if cand == best then
    best_gone = true
  end
end
if best_gone then
  recompute_best(KEYS[1], KEYS[2], KEYS[5])
end
return removed
