-- Queue calls for admission (Admission.enqueue). KEYS: active, clock, waiting, info,
-- payloads, deadlines, seq. ARGV: now, then six per call (as lib/enqueue.lua reads them).
-- Returns how many were queued.
--@include lib/enqueue.lua
-- luacheck: read globals enqueue
return enqueue(KEYS[7], 2, #ARGV)
