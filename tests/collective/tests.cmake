# Helper program of the multi-process collective tests (included from
# tests/CMakeLists.txt): one rank, bootstrapped from the environment.
add_executable(collective_probe ${CMAKE_CURRENT_LIST_DIR}/collective_probe.cpp)
target_link_libraries(collective_probe PRIVATE pushpull_collective)

# The launch-only CLI (tests/launch/tests.cmake), the full CLI (its `server`)
# and the KVStore example run by collective_launch_test.
if(TARGET collective_launch_test)
  add_dependencies(collective_launch_test collective_probe pushpull_launch_cli kvstore_basics
                   pushpull_cli)
endif()
if(TARGET shm_launch_test)
  add_dependencies(shm_launch_test collective_probe pushpull_launch_cli)
endif()
# The partial mesh's process tests run collective_probe.
if(TARGET mesh_launch_test)
  add_dependencies(mesh_launch_test collective_probe)
endif()
# The hierarchical allreduce's process tests run collective_probe.
if(TARGET hierarchical_launch_test)
  add_dependencies(hierarchical_launch_test collective_probe)
endif()

# The flight recorder of a hung job (docs/timeline.md, "Flight recorder"):
# rank 1 never calls an allreduce; the dumps name the rank and the tensor.
add_executable(flight_probe ${CMAKE_CURRENT_LIST_DIR}/flight_probe.cpp)
target_link_libraries(flight_probe PRIVATE pushpull_collective)
add_test(NAME flight_recorder_job
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/flight_recorder_job_test.py
                 ${PROJECT_BINARY_DIR}/bin)
set_tests_properties(flight_recorder_job PROPERTIES LABELS "collective;launch" TIMEOUT 120
                     SKIP_RETURN_CODE 77)
