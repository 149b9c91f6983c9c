-- luacheck (make lint): the stores' Lua scripts, as Redis runs them (Lua 5.1).
std = "lua51"
-- What Redis gives a script: its keys and arguments, the redis API and the bundled libraries.
read_globals = { "KEYS", "ARGV", "redis", "cjson", "cmsgpack", "bit", "struct" }
max_line_length = 100
exclude_files = { ".venv/**", ".artifacts/**", ".image-check/**", "**/node_modules/**" }
