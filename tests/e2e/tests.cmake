# Helper programs of the end-to-end tests (included from tests/CMakeLists.txt).
add_executable(ps_loop_worker ${CMAKE_CURRENT_LIST_DIR}/ps_loop_worker.cpp)
target_link_libraries(ps_loop_worker PRIVATE pushpull)
add_executable(ps_failover_worker ${CMAKE_CURRENT_LIST_DIR}/ps_failover_worker.cpp)
target_link_libraries(ps_failover_worker PRIVATE pushpull)
add_executable(ps_backup_worker ${CMAKE_CURRENT_LIST_DIR}/ps_backup_worker.cpp)
target_link_libraries(ps_backup_worker PRIVATE pushpull)
foreach(t ps_job_test ps_failover_test ps_checkpoint_test ps_restart_test ps_restart_limits_test
    ps_backup_test)
  if(TARGET ${t})
    add_dependencies(${t} ps_loop_worker ps_failover_worker ps_backup_worker kvstore_basics
                     pushpull_cli)
  endif()
endforeach()
# 20 random kill points per fail-over and worker-restart test (make test runs 2).
if(TARGET ps_failover_test)
  add_custom_target(failover-long
    COMMAND ${CMAKE_COMMAND} -E env PUSHPULL_FAILOVER_TRIALS=20 $<TARGET_FILE:ps_failover_test>
    COMMAND ${CMAKE_COMMAND} -E env PUSHPULL_FAILOVER_TRIALS=20 $<TARGET_FILE:ps_restart_test>
    DEPENDS ps_failover_test ps_restart_test USES_TERMINAL)
endif()
