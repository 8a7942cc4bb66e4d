# Tests of scripts/ (included from tests/CMakeLists.txt): plot.py turns small
# benchmark CSVs into PNGs; timeline-merge.py merges per-process timelines.
add_test(NAME plots_from_csv COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/plot_test.py ${PROJECT_SOURCE_DIR})
set_tests_properties(plots_from_csv PROPERTIES LABELS scripts SKIP_RETURN_CODE 77)
add_test(NAME timeline_merge COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/timeline_merge_test.py ${PROJECT_SOURCE_DIR})
set_tests_properties(timeline_merge PROPERTIES LABELS scripts)
# A timeline of real jobs (parameter server and collectives) under the launcher.
add_test(NAME timeline_job COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/timeline_job_test.py ${PROJECT_BINARY_DIR}/bin)
set_tests_properties(timeline_job PROPERTIES LABELS scripts TIMEOUT 600 SKIP_RETURN_CODE 77)
# Prometheus endpoints of a PS job, scraped directly and by Debian's prometheus
# when installed (the prometheus part is skipped, with its reason, otherwise).
add_test(NAME metrics_prometheus_job COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/metrics_prometheus_job_test.py ${PROJECT_BINARY_DIR}/bin)
set_tests_properties(metrics_prometheus_job PROPERTIES LABELS scripts TIMEOUT 120 SKIP_RETURN_CODE 77)
# --timeline-filename F: the launcher merges every process's file into F, clocks aligned.
add_test(NAME timeline_merged_job COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/timeline_merged_job_test.py ${PROJECT_BINARY_DIR}/bin)
set_tests_properties(timeline_merged_job PROPERTIES LABELS scripts TIMEOUT 180 SKIP_RETURN_CODE 77)
