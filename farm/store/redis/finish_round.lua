-- A round ran to its end. Only the holder of its fence (or a copy that finds no holder: its
-- lease expired and nobody took it) marks it done, and the lease goes in the same step, so a
-- copy that lost its lease never marks the round done nor starts the next one.
-- KEYS[1] the round's lease; KEYS[2] its done flag
-- ARGV[1] owner; ARGV[2] now (the flag's value); ARGV[3] the flag's time to live in seconds
-- Returns 1 when this copy marked the round done, 0 when another copy holds it.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'EX', tonumber(ARGV[3]))
if holder then
  redis.call('DEL', KEYS[1])
end
return 1
