# cluster_node: the test-only program the multi-process cluster tests start.
add_executable(cluster_node ${CMAKE_CURRENT_LIST_DIR}/node_main.cpp)
target_include_directories(cluster_node PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(cluster_node PRIVATE pushpull_cluster)
if(TARGET process_test)
  add_dependencies(process_test cluster_node)
endif()
