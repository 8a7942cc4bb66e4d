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

# The control plane at scale (scale_sim.h, docs/scaling.md "The control plane
# at 1,024 and 4,096 ranks"): scale_sim_test asserts its properties at 256
# ranks in `make test`; `make simulate-scale` prints the table for 1,024 and
# 4,096 ranks with the scale_sim program.
add_library(pushpull_scale_sim STATIC ${CMAKE_CURRENT_LIST_DIR}/scale_net.cpp
            ${CMAKE_CURRENT_LIST_DIR}/scale_ps.cpp ${CMAKE_CURRENT_LIST_DIR}/scale_collective.cpp
            ${CMAKE_CURRENT_LIST_DIR}/scale_negotiation.cpp)
target_include_directories(pushpull_scale_sim PUBLIC ${PROJECT_SOURCE_DIR}/src
                                                     ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(pushpull_scale_sim PUBLIC pushpull_ps pushpull_collective)
target_link_libraries(scale_sim_test PRIVATE pushpull_scale_sim)
add_executable(scale_sim ${CMAKE_CURRENT_LIST_DIR}/scale_main.cpp)
target_link_libraries(scale_sim PRIVATE pushpull_scale_sim)
