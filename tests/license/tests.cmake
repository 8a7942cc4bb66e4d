# LICENSE and scripts/add-spdx.sh (included from tests/CMakeLists.txt).
add_test(NAME license_spdx_script COMMAND ${CMAKE_CURRENT_LIST_DIR}/spdx_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(license_spdx_script PROPERTIES LABELS license)
