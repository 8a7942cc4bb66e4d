# Helper programs of the end-to-end tests (included from tests/CMakeLists.txt).
add_executable(ps_loop_worker ${CMAKE_CURRENT_LIST_DIR}/ps_loop_worker.cpp)
target_link_libraries(ps_loop_worker PRIVATE pushpull)
foreach(t ps_job_test)
  if(TARGET ${t})
    add_dependencies(${t} ps_loop_worker kvstore_basics pushpull_cli)
  endif()
endforeach()
