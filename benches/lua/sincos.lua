local sin, cos = math.sin, math.cos
local function sincos(x) return sin(cos(x)) end
function bench() return sincos(0.5) end
