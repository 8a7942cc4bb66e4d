# The wire decoders' fuzz targets (formerly tests/net/fuzz_decoder.cpp) live in
# tests/fuzz/ (see tests/fuzz/tests.cmake).

# The one-host PS job test runs a whole in-process job (kvstore layer).
target_link_libraries(shm_ps_job_test PRIVATE pushpull)
