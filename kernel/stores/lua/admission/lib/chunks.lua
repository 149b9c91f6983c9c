-- Multi-key commands in chunks (Lua's unpack takes a few thousand values at most): each runs
-- a command over a list, fetch gathers its replies; split cuts a string at each '\31'.
-- luacheck: ignore 211/each 211/fetch 211/split
local CHUNK = 500
local function each(cmd, key, list)
  for i = 1, #list, CHUNK do
    redis.call(cmd, key, unpack(list, i, math.min(i + CHUNK - 1, #list)))
  end
end
local function fetch(cmd, key, list)
  local out = {}
  for i = 1, #list, CHUNK do
    local part = redis.call(cmd, key, unpack(list, i, math.min(i + CHUNK - 1, #list)))
    for _, v in ipairs(part) do out[#out + 1] = v end
  end
  return out
end
local function split(s)
  local out, start = {}, 1
  while true do
    local i = string.find(s, '\31', start, true)
    if not i then
      out[#out + 1] = string.sub(s, start)
      return out
    end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end
