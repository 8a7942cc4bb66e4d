# The deterministic simulation of parameter-server recovery (tests/sim/,
# docs/reliability.md "Deterministic simulation"): ps_sim_test runs a sample
# of seeds in `make test`; `make simulate` runs 10^4 seeds with the ps_sim
# program (SIM_SEEDS=N to change).
add_library(pushpull_sim_world STATIC ${CMAKE_CURRENT_LIST_DIR}/ps_world.cpp
            ${CMAKE_CURRENT_LIST_DIR}/ps_world_workers.cpp ${CMAKE_CURRENT_LIST_DIR}/ps_world_servers.cpp)
target_include_directories(pushpull_sim_world PUBLIC ${PROJECT_SOURCE_DIR}/src
                                                     ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(pushpull_sim_world PUBLIC pushpull_ps)
target_link_libraries(ps_sim_test PRIVATE pushpull_sim_world)
add_executable(ps_sim ${CMAKE_CURRENT_LIST_DIR}/ps_sim_main.cpp)
target_link_libraries(ps_sim PRIVATE pushpull_sim_world)
