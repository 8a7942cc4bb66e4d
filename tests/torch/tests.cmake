# libtorch tests (included from tests/CMakeLists.txt). The sources are not
# named *_test.cpp so the generic glob leaves them alone: they need
# pushpull_torch, which exists only when libtorch was found.
if(NOT TARGET pushpull_torch)
  message(STATUS "tests/torch: libtorch not found; torch tests not built")
  return()
endif()

add_executable(torch_trainer_test ${CMAKE_CURRENT_LIST_DIR}/trainer_tests.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_unit_tests.cpp)
target_link_libraries(torch_trainer_test PRIVATE pushpull_torch pushpull_test_support
  GTest::gtest CLI11::CLI11)
target_compile_definitions(torch_trainer_test PRIVATE
  PUSHPULL_BIN_DIR="${CMAKE_BINARY_DIR}/bin" PUSHPULL_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
# The launched equivalence setups run `pushpull launch`.
add_dependencies(torch_trainer_test pushpull_cli)
gtest_discover_tests(torch_trainer_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 LABELS torch)

# The short training run of examples/lenet (a few hundred steps on a subset).
add_executable(torch_lenet_smoke_test ${CMAKE_CURRENT_LIST_DIR}/lenet_smoke.cpp)
target_link_libraries(torch_lenet_smoke_test PRIVATE pushpull_test_support GTest::gtest_main)
target_compile_definitions(torch_lenet_smoke_test PRIVATE
  PUSHPULL_BIN_DIR="${CMAKE_BINARY_DIR}/bin" PUSHPULL_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
gtest_discover_tests(torch_lenet_smoke_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 LABELS torch)
if(PUSHPULL_BUILD_EXAMPLES AND EXISTS ${CMAKE_SOURCE_DIR}/examples/lenet/CMakeLists.txt)
  add_dependencies(torch_lenet_smoke_test lenet)
endif()

# DistributedOptimizer and the broadcasts; the launched cases run
# `pushpull launch -s 0` with this binary as the workers.
add_executable(torch_distributed_optimizer_test
  ${CMAKE_CURRENT_LIST_DIR}/distributed_optimizer_tests.cpp ${CMAKE_CURRENT_LIST_DIR}/dopt_worker.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dopt_world_of_one_tests.cpp)
target_link_libraries(torch_distributed_optimizer_test PRIVATE pushpull_torch pushpull_test_support
  GTest::gtest CLI11::CLI11)
target_compile_definitions(torch_distributed_optimizer_test PRIVATE
  PUSHPULL_BIN_DIR="${CMAKE_BINARY_DIR}/bin" PUSHPULL_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(torch_distributed_optimizer_test pushpull_cli)
gtest_discover_tests(torch_distributed_optimizer_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 LABELS torch)

# DistributedOptimizer with 2bit/1bit compression (allgathered codes); the
# launched cases run `pushpull launch -s 0` with this binary as the workers.
add_executable(torch_dopt_codes_test ${CMAKE_CURRENT_LIST_DIR}/dopt_codes_tests.cpp)
target_link_libraries(torch_dopt_codes_test PRIVATE pushpull_torch pushpull_test_support
  GTest::gtest CLI11::CLI11)
target_compile_definitions(torch_dopt_codes_test PRIVATE
  PUSHPULL_BIN_DIR="${CMAKE_BINARY_DIR}/bin" PUSHPULL_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(torch_dopt_codes_test pushpull_cli)
gtest_discover_tests(torch_dopt_codes_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 LABELS torch)

# DistributedOptimizer with sparse gradients (allgathered, or sparse_as_dense);
# the launched cases run `pushpull launch -s 0` with this binary as the workers.
add_executable(torch_dopt_sparse_test ${CMAKE_CURRENT_LIST_DIR}/dopt_sparse_tests.cpp)
target_link_libraries(torch_dopt_sparse_test PRIVATE pushpull_torch pushpull_test_support
  GTest::gtest CLI11::CLI11)
target_compile_definitions(torch_dopt_sparse_test PRIVATE
  PUSHPULL_BIN_DIR="${CMAKE_BINARY_DIR}/bin" PUSHPULL_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(torch_dopt_sparse_test pushpull_cli)
gtest_discover_tests(torch_dopt_sparse_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 LABELS torch)

# pushpull::torch::elastic in one process (TorchState, run re-forming the
# default session); whole elastic jobs: python/tests/test_elastic.py.
add_executable(torch_elastic_test ${CMAKE_CURRENT_LIST_DIR}/elastic_tests.cpp)
target_link_libraries(torch_elastic_test PRIVATE pushpull_torch GTest::gtest_main)
gtest_discover_tests(torch_elastic_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 LABELS torch)

# `pushpull bench step --impls cpp`: the libtorch DistributedOptimizer worker
# (integrations/torch/examples/bench_step.cpp) runs under the benchmark and
# prints its row.
add_test(NAME bench_step_cpp
         COMMAND sh -c "\"$<TARGET_FILE:pushpull_cli>\" bench step -n 2 --grad-mb 1 --impls cpp --steps 2 --warmup 1 --repeats 1 --format csv --timeout 120 | grep '^cpp,2,0,1048576,8,[0-9.]*,,,,$'")
set_tests_properties(bench_step_cpp PROPERTIES LABELS "torch;bench" TIMEOUT 300)

# DistributedOptimizer with a sparse gradient a rank does not get in a step
# (declared, known from an earlier step, or a clear error on every rank); the
# launched cases run `pushpull launch -s 0` with this binary as the workers.
add_executable(torch_dopt_sparse_missing_test ${CMAKE_CURRENT_LIST_DIR}/dopt_sparse_missing_tests.cpp)
target_link_libraries(torch_dopt_sparse_missing_test PRIVATE pushpull_torch pushpull_test_support
  GTest::gtest CLI11::CLI11)
target_include_directories(torch_dopt_sparse_missing_test PRIVATE
  ${CMAKE_SOURCE_DIR}/integrations/torch/src)  # sparse_gradients.h: explain_mismatch
target_compile_definitions(torch_dopt_sparse_missing_test PRIVATE
  PUSHPULL_BIN_DIR="${CMAKE_BINARY_DIR}/bin" PUSHPULL_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
add_dependencies(torch_dopt_sparse_missing_test pushpull_cli)
gtest_discover_tests(torch_dopt_sparse_missing_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 LABELS torch)
