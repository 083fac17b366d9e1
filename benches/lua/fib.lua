-- Recursive calls, as benches/zy/fib.zy.
local function fib(n)
  if n < 2 then return n end
  return fib(n - 1) + fib(n - 2)
end
function bench() return fib(20) + 0.0 end
