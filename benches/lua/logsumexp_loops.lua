local data = DATA
local exp, log = math.exp, math.log
local function logsumexp_loops(x)
  local s = 0.0
  for i = 1, #x do s = s + exp(x[i]) end
  return log(s)
end
local X = data.randn(1, 100)
function bench() return logsumexp_loops(X) end
