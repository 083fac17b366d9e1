local data = DATA
local exp = math.exp
-- W is row-major m x k, like a Zy matrix.
local function logreg_loops(W, m, k, b, x)
  local total = 0.0
  for i = 0, m - 1 do
    local z = b[i + 1]
    for j = 0, k - 1 do
      z = z + W[i * k + j + 1] * x[j + 1]
    end
    total = total + 1.0 / (1.0 + exp(-z))
  end
  return total
end
local W, B, X = data.randn(2, 10 * 784), data.randn(3, 10), data.rand(4, 784)
function bench() return logreg_loops(W, 10, 784, B, X) end
