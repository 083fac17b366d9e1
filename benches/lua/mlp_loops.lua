local data = DATA
local exp, log, tanh = math.exp, math.log, math.tanh or function(x) local e = math.exp(2 * x) return (e - 1) / (e + 1) end
local function mlp_loops(W1, m1, k1, b1, W2, m2, k2, b2, x)
  local h = {}
  for i = 0, m1 - 1 do
    local z = b1[i + 1]
    for j = 0, k1 - 1 do z = z + W1[i * k1 + j + 1] * x[j + 1] end
    h[i + 1] = tanh(z)
  end
  local o = {}
  for i = 0, m2 - 1 do
    local z = b2[i + 1]
    for j = 0, k2 - 1 do z = z + W2[i * k2 + j + 1] * h[j + 1] end
    o[i + 1] = z
  end
  local s = 0.0
  for i = 1, m2 do s = s + exp(o[i]) end
  return log(s) - o[4]
end
local W1 = data.scale(data.randn(5, 128 * 784), 0.05)
local B1 = data.zeros(128)
local W2 = data.scale(data.randn(6, 10 * 128), 0.1)
local B2 = data.zeros(10)
local X = data.rand(4, 784)
function bench() return mlp_loops(W1, 128, 784, B1, W2, 10, 128, B2, X) end
