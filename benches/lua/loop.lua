local sin = math.sin
local function loop_sin(x)
  local r = 1.0
  local n = 500
  while n > 0 do
    r = r * sin(x)
    n = n - 1
  end
  return r
end
function bench() return loop_sin(2.0) end
