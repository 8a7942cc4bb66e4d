# Fuzz targets: one per family of wire decoders (tests/fuzz/fuzz_*.cpp), each
# defining LLVMFuzzerTestOneInput. Included from tests/CMakeLists.txt.
#
#  - Ordinary builds (g++): each target links the plain driver
#    (driver_main.cpp: corpus replay + mutations) and `make test` runs it
#    briefly (ctest fuzz.<name without fuzz_>, label fuzz). When clang++ is installed the
#    header and handshake targets are also built with libFuzzer + ASan/UBSan
#    (fuzz.<target>.libfuzzer), as tests/net did before.
#  - -DPUSHPULL_FUZZ=ON with clang and PUSHPULL_SANITIZE=fuzzer-no-link,address,undefined
#    (what `make fuzz` configures in build-fuzz/): every target is a real
#    libFuzzer binary over the instrumented library; tests/fuzz/run.sh runs them.
# Seeds come from the repository's own encoders: fuzz_seeds writes them
# (ctest fixture fuzz.seeds, or run.sh) to <build>/fuzz-corpus/<target>/.
option(PUSHPULL_FUZZ "Link the fuzz targets with libFuzzer (clang only)" OFF)
if(PUSHPULL_FUZZ AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "PUSHPULL_FUZZ=ON needs clang (libFuzzer); use `make fuzz`")
endif()

set(PUSHPULL_FUZZ_CORPUS ${CMAKE_BINARY_DIR}/fuzz-corpus)
add_executable(fuzz_seeds ${CMAKE_CURRENT_LIST_DIR}/fuzz_seeds.cpp)
target_include_directories(fuzz_seeds PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(fuzz_seeds PRIVATE pushpull)
add_test(NAME fuzz.seeds COMMAND fuzz_seeds ${PUSHPULL_FUZZ_CORPUS})
set_tests_properties(fuzz.seeds PROPERTIES LABELS fuzz FIXTURES_SETUP fuzz_corpus)

add_custom_target(fuzz_all DEPENDS fuzz_seeds)

# pushpull_fuzz_target(NAME LIBRARY [CLANG_SOURCES src...]): CLANG_SOURCES,
# when given, are enough to build the target standalone with clang's libFuzzer
# inside an ordinary build.
function(pushpull_fuzz_target name library)
  cmake_parse_arguments(F "" "" "CLANG_SOURCES" ${ARGN})
  set(src ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/${name}.cpp)
  string(REGEX REPLACE "^fuzz_" "" short ${name})
  if(PUSHPULL_FUZZ)
    add_executable(${name} ${src})
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  else()
    add_executable(${name} ${src} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/driver_main.cpp)
  endif()
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src
                                             ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  target_link_libraries(${name} PRIVATE ${library})
  add_dependencies(fuzz_all ${name})
  add_test(NAME fuzz.${short}
           COMMAND ${name} -runs=20000 -max_total_time=10 -seed=1 -malloc_limit_mb=16 ${PUSHPULL_FUZZ_CORPUS}/${name})
  set_tests_properties(fuzz.${short} PROPERTIES LABELS fuzz TIMEOUT 120
                       FIXTURES_REQUIRED fuzz_corpus)

  if(NOT PUSHPULL_FUZZ AND PUSHPULL_CLANGXX AND F_CLANG_SOURCES)
    set(bin ${CMAKE_BINARY_DIR}/bin/${name}_libfuzzer)
    add_custom_command(
      OUTPUT ${bin}
      COMMAND ${PUSHPULL_CLANGXX} -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined
              -I${CMAKE_SOURCE_DIR}/include -I${CMAKE_SOURCE_DIR}/src
              -I${CMAKE_BINARY_DIR}/generated -I${CMAKE_CURRENT_FUNCTION_LIST_DIR}
              ${src} ${F_CLANG_SOURCES} -lfmt -lcrypto -o ${bin}
      DEPENDS ${src} ${F_CLANG_SOURCES} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/fuzz_input.h
              ${CMAKE_SOURCE_DIR}/src/transport/message.h ${CMAKE_SOURCE_DIR}/src/transport/hello.h
              ${CMAKE_SOURCE_DIR}/src/transport/wire.h
      COMMENT "Building the libFuzzer target ${name}_libfuzzer with clang"
      VERBATIM)
    add_custom_target(${name}_libfuzzer ALL DEPENDS ${bin})
    add_test(NAME fuzz.${short}.libfuzzer
             COMMAND ${bin} -runs=20000 -max_total_time=10 -seed=1 -malloc_limit_mb=16 ${PUSHPULL_FUZZ_CORPUS}/${name})
    set_tests_properties(fuzz.${short}.libfuzzer PROPERTIES LABELS fuzz TIMEOUT 120
                         FIXTURES_REQUIRED fuzz_corpus)
  endif()
endfunction()

if(NOT PUSHPULL_FUZZ)
  find_program(PUSHPULL_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
endif()
set(net_srcs ${CMAKE_SOURCE_DIR}/src/transport/message.cpp ${CMAKE_SOURCE_DIR}/src/transport/hello.cpp
             ${CMAKE_SOURCE_DIR}/src/base/error.cpp)
pushpull_fuzz_target(fuzz_net_header pushpull_transport CLANG_SOURCES ${net_srcs})
pushpull_fuzz_target(fuzz_net_handshake pushpull_transport CLANG_SOURCES ${net_srcs})
pushpull_fuzz_target(fuzz_net_shm pushpull_transport)
pushpull_fuzz_target(fuzz_cluster_messages pushpull_cluster)
pushpull_fuzz_target(fuzz_ps_messages pushpull_ps)
pushpull_fuzz_target(fuzz_collective_messages pushpull_collective)
pushpull_fuzz_target(fuzz_rendezvous pushpull_collective)
pushpull_fuzz_target(fuzz_ps_store pushpull_ps)
pushpull_fuzz_target(fuzz_optimizer_states pushpull_optim)
pushpull_fuzz_target(fuzz_ps_checkpoint pushpull_ps)
pushpull_fuzz_target(fuzz_data_idx pushpull_data)
pushpull_fuzz_target(fuzz_compress_reply pushpull_compress)
pushpull_fuzz_target(fuzz_compress_gathered pushpull_compress)
