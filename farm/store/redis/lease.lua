-- Take or renew a lease, atomically (a workload's, a round's, the supervisor's).
-- KEYS[1] lease key
-- ARGV[1] owner; ARGV[2] time to live in ms
-- ARGV[3] a holder known to be dead, whose lease may be taken over, or ""
-- Returns "" when ARGV[1] holds the lease now, else the holder.
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur == ARGV[1] or (ARGV[3] ~= '' and cur == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ''
end
return cur
