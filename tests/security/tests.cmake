# The adversary suite (tests/security/adversary.py, label "security"): real
# jobs started by `pushpull launch`, attacked on every listening port while
# they run. Run it alone with `ctest -L security`.
add_executable(adversary_ps_worker ${CMAKE_CURRENT_LIST_DIR}/adversary_ps_worker.cpp)
target_link_libraries(adversary_ps_worker PRIVATE pushpull)
add_executable(adversary_allreduce_worker ${CMAKE_CURRENT_LIST_DIR}/adversary_allreduce_worker.cpp)
target_link_libraries(adversary_allreduce_worker PRIVATE pushpull_collective)
# The TLS wire test's worker: pushes a 1 MiB tensor of a recognisable pattern.
add_executable(tls_wire_worker ${CMAKE_CURRENT_LIST_DIR}/tls_wire_worker.cpp)
target_link_libraries(tls_wire_worker PRIVATE pushpull)

find_program(PUSHPULL_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT PUSHPULL_PYTHON3)
  find_program(PUSHPULL_PYTHON3 NAMES python3)
endif()
if(PUSHPULL_PYTHON3)
  foreach(job ps collective)
    foreach(secret explicit generated)
      add_test(NAME security.${job}.${secret}_secret
               COMMAND ${PUSHPULL_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/adversary.py
                       --bin-dir ${CMAKE_BINARY_DIR}/bin --job ${job} --secret ${secret})
      # One at a time (each floods with thousands of connections), two cores' worth.
      set_tests_properties(security.${job}.${secret}_secret PROPERTIES LABELS security TIMEOUT 240
                           RESOURCE_LOCK pushpull_adversary PROCESSORS 2)
    endforeach()
  endforeach()
  # Another local user (uid 65534, via setpriv) against jobs started without
  # a secret set by hand (torchrun-style variables, the per-node mode): the
  # per-user secret file must keep it out (issue 35). Skipped (77) when not
  # root or without setpriv.
  add_test(NAME security.local_attacker
           COMMAND ${PUSHPULL_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/local_attacker.py
                   --bin-dir ${CMAKE_BINARY_DIR}/bin)
  set_tests_properties(security.local_attacker PROPERTIES LABELS security TIMEOUT 300
                       SKIP_RETURN_CODE 77 RESOURCE_LOCK pushpull_adversary PROCESSORS 2)
  # Every frame between network-namespace hosts captured while per-node
  # jobs (PS and collectives) run with and without PUSHPULL_TLS=1: the
  # plain runs show the tensor's pattern, the TLS runs nothing but TLS
  # records. Skipped (77) when not root or without `ip netns`.
  add_test(NAME security.tls_wire
           COMMAND ${PUSHPULL_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/tls_wire_test.py
                   --bin-dir ${CMAKE_BINARY_DIR}/bin)
  set_tests_properties(security.tls_wire PROPERTIES LABELS security TIMEOUT 180
                       SKIP_RETURN_CODE 77 RESOURCE_LOCK pushpull_adversary PROCESSORS 2)
  # Another local user against the names a job makes in shared places (a
  # few seconds each): /dev/shm names seen through inotify and squatted
  # (shm_squatter.py), symlinks and files planted at a job's timeline,
  # metrics and checkpoint names (planted_links.py). Skipped (77) when not
  # root or without setpriv.
  foreach(script shm_squatter planted_links)
    add_test(NAME security.${script}
             COMMAND ${PUSHPULL_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/${script}.py
                     --bin-dir ${CMAKE_BINARY_DIR}/bin)
    set_tests_properties(security.${script} PROPERTIES LABELS security TIMEOUT 120
                         SKIP_RETURN_CODE 77 RESOURCE_LOCK pushpull_adversary PROCESSORS 2)
  endforeach()
  # MASTER_PORT, held by the launcher for a torch.distributed store (any user).
  add_test(NAME security.torch_store_port
           COMMAND ${PUSHPULL_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/torch_store_port.py
                   --bin-dir ${CMAKE_BINARY_DIR}/bin)
  set_tests_properties(security.torch_store_port PROPERTIES LABELS security TIMEOUT 120
                       PROCESSORS 2)
endif()
