# `pushpull bench scaling` / `bench ps --netns` on network-namespace hosts
# (included from tests/CMakeLists.txt): a short run of 2 worker hosts, the CSV
# checked, and the namespaces gone afterwards, also when the benchmark is
# killed mid-run. Skips (exit 77) unless root with network namespaces.
add_test(NAME bench_scaling_netns
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/scaling_netns_test.py ${PROJECT_BINARY_DIR}/bin)
set_tests_properties(bench_scaling_netns PROPERTIES LABELS bench TIMEOUT 600 SKIP_RETURN_CODE 77
                     RUN_SERIAL TRUE)

# The benchmarks' statistics (tools/bench_common.cpp) as a unit test.
target_sources(bench_common_test PRIVATE ${PROJECT_SOURCE_DIR}/tools/bench_common.cpp)
target_include_directories(bench_common_test PRIVATE ${PROJECT_SOURCE_DIR}/tools)

# `pushpull bench startup` (docs/scaling.md "Start-up"): 4 and 8 ranks, one
# repeat, both engines, the CSV checked; a failing run reported as such.
add_test(NAME bench_startup_short
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/startup_test.py ${PROJECT_BINARY_DIR}/bin)
set_tests_properties(bench_startup_short PROPERTIES LABELS bench TIMEOUT 300)
target_sources(bench_startup_fit_test PRIVATE ${PROJECT_SOURCE_DIR}/tools/bench_startup_fit.cpp)
target_include_directories(bench_startup_fit_test PRIVATE ${PROJECT_SOURCE_DIR}/tools)

# `pushpull bench allreduce --compression` (docs/collectives.md "Gradient
# compression"): 3 loopback ranks, every codec (and the reduce-scatter
# variants) one short run; each worker checks its first result against the
# codec's closed form, so a missing row (a failed run) fails the test.
add_test(NAME bench_allreduce_codecs_short
         COMMAND sh -c "out=$(\"$<TARGET_FILE:pushpull_cli>\" bench allreduce -n 3 --sizes 64K --iters 2 --warmup 1 --repeats 1 --compression none,fp16,2bit,1bit,2bit_rs,1bit_rs --impl pushpull --format csv --timeout 120) && for c in pushpull pushpull_fp16 pushpull_2bit pushpull_1bit pushpull_2bit_rs pushpull_1bit_rs; do echo \"$out\" | grep -q \"^$c,3,65536,[0-9.]*,\" || { echo \"no $c row in: $out\"; exit 1; }; done")
set_tests_properties(bench_allreduce_codecs_short PROPERTIES LABELS bench TIMEOUT 300)
