# The wire decoders' fuzz targets (formerly tests/net/fuzz_decoder.cpp) live in
# tests/fuzz/ (see tests/fuzz/tests.cmake).
