-- Seeded inputs of the same sizes as the Zy workloads (values differ; sizes and types match).
local data = {}
function data.randn(seed, n)
  local rng = seed * 1103515245 + 12345
  local out = {}
  local i = 1
  while i <= n do
    rng = (rng * 6364136223846793005 + 1442695040888963407) % 9007199254740993
    local u1 = (rng % 1000003) / 1000003
    rng = (rng * 6364136223846793005 + 1442695040888963407) % 9007199254740993
    local u2 = (rng % 999983) / 999983
    local r = math.sqrt(-2.0 * math.log(1.0 - u1))
    out[i] = r * math.cos(2 * math.pi * u2)
    if i + 1 <= n then out[i + 1] = r * math.sin(2 * math.pi * u2) end
    i = i + 2
  end
  return out
end
function data.rand(seed, n)
  local out = data.randn(seed, n)
  for i = 1, n do out[i] = math.abs(out[i]) % 1.0 end
  return out
end
function data.scale(v, k) for i = 1, #v do v[i] = v[i] * k end return v end
function data.zeros(n) local v = {} for i = 1, n do v[i] = 0.0 end return v end
return data
