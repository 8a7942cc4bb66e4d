# Helper programs of the launch tests (included from tests/CMakeLists.txt).
add_executable(launch_probe ${CMAKE_CURRENT_LIST_DIR}/probe.cpp)
target_link_libraries(launch_probe PRIVATE pushpull_base)

# A real cluster node (register, barrier, leave) for end-to-end launches.
add_executable(launch_node_probe ${CMAKE_CURRENT_LIST_DIR}/node_probe.cpp)
target_include_directories(launch_node_probe PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(launch_node_probe PRIVATE pushpull_cluster)

# tools/launch.cpp with a main of its own, so the launch tests do not depend
# on every layer the full `pushpull` binary links.
add_executable(pushpull_launch_cli ${CMAKE_SOURCE_DIR}/tools/launch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/launch_cli_main.cpp)
target_include_directories(pushpull_launch_cli PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tools)
# pushpull_ps: --resume checks the checkpoint files (src/ps/checkpoint.h).
target_link_libraries(pushpull_launch_cli PRIVATE pushpull_launch pushpull_ps CLI11::CLI11)

foreach(t launch_local_test launch_ssh_test launch_mpi_test launch_cli_test launch_liveness_test
    launch_security_test launch_cluster_env_test)
  if(TARGET ${t})
    add_dependencies(${t} launch_probe launch_node_probe pushpull_launch_cli)
  endif()
endforeach()

# Cluster managers on network-namespace hosts (need root; skip with exit 77
# and the reason otherwise): a real Slurm (slurmctld, two slurmd, munge)
# running the sbatch scripts of examples/slurm/, and Kubernetes pods as the
# manifests of examples/kubernetes/ describe them.
add_test(NAME launch_slurm_cluster
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/slurm_cluster_test.py
                 ${PROJECT_BINARY_DIR}/bin ${PROJECT_SOURCE_DIR})
set_tests_properties(launch_slurm_cluster PROPERTIES LABELS launch TIMEOUT 180
                     SKIP_RETURN_CODE 77)
add_test(NAME launch_kubernetes_pods
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/kubernetes_pods_test.py
                 ${PROJECT_BINARY_DIR}/bin ${PROJECT_SOURCE_DIR})
set_tests_properties(launch_kubernetes_pods PROPERTIES LABELS launch TIMEOUT 180
                     SKIP_RETURN_CODE 77)
