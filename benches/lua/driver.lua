-- Times `iters` calls of a workload's bench() after a warm-up; prints the total seconds.
-- usage: lua driver.lua WORKLOAD.lua ITERS
local file, iters = arg[1], tonumber(arg[2])
local dir = file:match("(.*/)") or "./"
DATA = dofile(dir .. "data.lua")
dofile(file)
for _ = 1, math.min(iters, 100) do bench() end
local t0 = os.clock()
local sink = 0.0
for _ = 1, iters do sink = sink + bench() end
local t1 = os.clock()
io.write(string.format("%.9f %.17g\n", t1 - t0, sink))
