# tests/install: a consumer project built against pushpull as a user gets it
# (included from tests/CMakeLists.txt; the script is tests/install/install_test.sh).
set(_install_test ${CMAKE_CURRENT_LIST_DIR}/install_test.sh)
foreach(mode package pkgconfig deb subdirectory torch)
  add_test(NAME install_${mode}
    COMMAND ${_install_test} ${mode} ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
  # A sanitizer build installs libraries that need the sanitizer runtime,
  # which a user's consumer does not link: the script skips (77) then.
  set_tests_properties(install_${mode} PROPERTIES
    ENVIRONMENT "PUSHPULL_TEST_SANITIZE=${PUSHPULL_SANITIZE}")
  # Exit 77: a tool is missing (reported as skipped, not passed).
  set_tests_properties(install_${mode} PROPERTIES LABELS install SKIP_RETURN_CODE 77
    RESOURCE_LOCK install_${mode})
endforeach()
# add_subdirectory compiles the library again (ccache helps when warm).
set_tests_properties(install_subdirectory install_torch PROPERTIES TIMEOUT 1800)
