# fuzz_decoder: libFuzzer target for the wire decoders, built with clang
# (-fsanitize=fuzzer,address,undefined) outside the g++ toolchain, and run
# briefly as a ctest test when clang++ is installed.
find_program(PUSHPULL_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
if(PUSHPULL_CLANGXX)
  set(fuzz_srcs
    ${CMAKE_CURRENT_LIST_DIR}/fuzz_decoder.cpp
    ${CMAKE_SOURCE_DIR}/src/net/message.cpp
    ${CMAKE_SOURCE_DIR}/src/net/hello.cpp
    ${CMAKE_SOURCE_DIR}/src/base/error.cpp)
  set(fuzz_bin ${CMAKE_BINARY_DIR}/bin/fuzz_decoder)
  add_custom_command(
    OUTPUT ${fuzz_bin}
    COMMAND ${PUSHPULL_CLANGXX} -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined
            -I${CMAKE_SOURCE_DIR}/include -I${CMAKE_SOURCE_DIR}/src -I${CMAKE_BINARY_DIR}/generated
            ${fuzz_srcs} -lfmt -lcrypto -o ${fuzz_bin}
    DEPENDS ${fuzz_srcs} ${CMAKE_SOURCE_DIR}/src/net/message.h ${CMAKE_SOURCE_DIR}/src/net/hello.h
            ${CMAKE_SOURCE_DIR}/src/net/wire.h
    COMMENT "Building the libFuzzer target fuzz_decoder with clang"
    VERBATIM)
  add_custom_target(fuzz_decoder ALL DEPENDS ${fuzz_bin})
  add_test(NAME net.fuzz_decoder
           COMMAND ${fuzz_bin} -runs=200000 -max_total_time=20 -seed=1)
  set_tests_properties(net.fuzz_decoder PROPERTIES LABELS net TIMEOUT 120)
endif()
