# scripts/plot.py turns small benchmark CSVs into PNGs (included from tests/CMakeLists.txt).
add_test(NAME plots_from_csv COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/plot_test.py ${PROJECT_SOURCE_DIR})
set_tests_properties(plots_from_csv PROPERTIES LABELS plots SKIP_RETURN_CODE 77)
