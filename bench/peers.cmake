# Peer drivers for `pushpull bench allreduce` (bench/peers/): built only when
# Open MPI (FindMPI) and Gloo (+ hiredis, ibverbs, which Debian's libgloo
# needs) are installed. They land next to the pushpull CLI in bin/, where the
# benchmark looks for them.
find_package(MPI COMPONENTS CXX QUIET)
if(MPI_CXX_FOUND)
  add_executable(pp_mpi_allreduce ${CMAKE_CURRENT_SOURCE_DIR}/peers/mpi_allreduce.cpp)
  target_link_libraries(pp_mpi_allreduce PRIVATE MPI::MPI_CXX)
  add_dependencies(pushpull_cli pp_mpi_allreduce)
else()
  message(STATUS "pushpull: Open MPI not found; bench allreduce runs without it")
endif()
find_package(Gloo QUIET)
find_library(PUSHPULL_HIREDIS hiredis)
find_library(PUSHPULL_IBVERBS ibverbs)
find_path(PUSHPULL_GLOO_INCLUDE gloo/allreduce.h)
find_library(PUSHPULL_GLOO gloo)
if(PUSHPULL_GLOO AND PUSHPULL_GLOO_INCLUDE AND PUSHPULL_HIREDIS AND PUSHPULL_IBVERBS)
  add_executable(pp_gloo_allreduce ${CMAKE_CURRENT_SOURCE_DIR}/peers/gloo_allreduce.cpp)
  target_include_directories(pp_gloo_allreduce PRIVATE ${PUSHPULL_GLOO_INCLUDE})
  target_link_libraries(pp_gloo_allreduce PRIVATE ${PUSHPULL_GLOO} ${PUSHPULL_HIREDIS}
                                                  ${PUSHPULL_IBVERBS} Threads::Threads)
  add_dependencies(pushpull_cli pp_gloo_allreduce)
  # `pushpull bench scaling`'s Gloo peer: the simulated training step over Gloo's ring.
  add_executable(pp_gloo_step ${CMAKE_CURRENT_SOURCE_DIR}/peers/gloo_step.cpp)
  target_include_directories(pp_gloo_step PRIVATE ${PUSHPULL_GLOO_INCLUDE})
  target_link_libraries(pp_gloo_step PRIVATE ${PUSHPULL_GLOO} ${PUSHPULL_HIREDIS} ${PUSHPULL_IBVERBS}
                                             Threads::Threads)
  add_dependencies(pushpull_cli pp_gloo_step)
else()
  message(STATUS "pushpull: Gloo not found; bench allreduce runs without it")
endif()
