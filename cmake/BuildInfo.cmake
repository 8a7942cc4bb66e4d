# Writes generated/pushpull/build_info.h with what `pushpull info` prints.
string(TIMESTAMP PUSHPULL_BUILD_DATE "%Y-%m-%d" UTC)
if(PUSHPULL_SANITIZE)
  list(APPEND PUSHPULL_FEATURES "sanitize=${PUSHPULL_SANITIZE}")
endif()
list(APPEND PUSHPULL_FEATURES "hmac=openssl-${OPENSSL_VERSION}")
list(JOIN PUSHPULL_FEATURES " " PUSHPULL_FEATURES_STR)
configure_file(${PROJECT_SOURCE_DIR}/cmake/build_info.h.in
               ${PROJECT_BINARY_DIR}/generated/pushpull/build_info.h @ONLY)
