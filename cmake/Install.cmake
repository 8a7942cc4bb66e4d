# What `cmake --install` puts under the prefix (docs/install.md):
#   include/pushpull/...                    public headers (+ build_info.h, torch headers)
#   lib/libpushpull_<layer>.a               the static per-layer libraries (pushpull::pushpull)
#   lib/libpushpull.so                      every layer in one shared library (pushpull::shared)
#   bin/pushpull                            the CLI (pushpull::cli)
#   lib/cmake/pushpull/pushpullConfig.cmake (+ ConfigVersion, Targets, TorchTargets)
#   lib/pkgconfig/pushpull.pc
# and CPack's .deb (`make package`). A parent project that add_subdirectory()s
# pushpull gets no install rules unless it sets PUSHPULL_INSTALL=ON.
include(CMakePackageConfigHelpers)
option(PUSHPULL_INSTALL "Generate the install rules and the CPack package" ${PROJECT_IS_TOP_LEVEL})

# The static layers, in link order (a library before the ones it uses).
set(PUSHPULL_STATIC_LINK_ORDER frontend kvstore launch data ps collective cluster transport compress optim base)

# libpushpull.so: the objects of every static layer (all built with -fPIC),
# linked whole into one shared library, so nothing is compiled twice.
if(PUSHPULL_BUILD_SHARED)
  set(_stub ${PROJECT_BINARY_DIR}/generated/pushpull_shared_stub.cpp)
  file(CONFIGURE OUTPUT ${_stub} CONTENT "// Generated: libpushpull.so is the static layers linked whole.\n")
  add_library(pushpull_shared SHARED ${_stub})
  set(_archives "")
  foreach(layer ${PUSHPULL_STATIC_LINK_ORDER})
    get_target_property(_type pushpull_${layer} TYPE)
    if(_type STREQUAL "STATIC_LIBRARY")
      list(APPEND _archives $<TARGET_FILE:pushpull_${layer}>)
      add_dependencies(pushpull_shared pushpull_${layer})
    endif()
  endforeach()
  # Plain archive paths (not targets): the layers' own usage requirements
  # would otherwise put each archive on the line a second time.
  target_link_libraries(pushpull_shared
    PRIVATE -Wl,--whole-archive ${_archives} -Wl,--no-whole-archive
            OpenSSL::SSL OpenSSL::Crypto ZLIB::ZLIB
    PUBLIC fmt::fmt Threads::Threads)
  target_link_options(pushpull_shared PRIVATE -Wl,--no-undefined)
  target_include_directories(pushpull_shared INTERFACE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(pushpull_shared INTERFACE cxx_std_20)
  set_target_properties(pushpull_shared PROPERTIES
    OUTPUT_NAME pushpull EXPORT_NAME shared
    VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  add_library(pushpull::shared ALIAS pushpull_shared)
endif()
target_compile_features(pushpull INTERFACE cxx_std_20)

if(NOT PUSHPULL_INSTALL)
  return()
endif()

set(PUSHPULL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/pushpull)
get_property(_layers GLOBAL PROPERTY PUSHPULL_LAYERS)
set(_export_targets ${_layers} pushpull pushpull_cli)
if(TARGET pushpull_shared)
  list(APPEND _export_targets pushpull_shared)
endif()
set_target_properties(pushpull_cli PROPERTIES EXPORT_NAME cli)
install(TARGETS ${_export_targets} EXPORT pushpullTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pushpull DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/generated/pushpull/build_info.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pushpull)
install(EXPORT pushpullTargets NAMESPACE pushpull:: DESTINATION ${PUSHPULL_CMAKE_DIR})

# The libtorch integration: its own export set, loaded by pushpullConfig.cmake
# only when the consumer finds libtorch too.
if(TARGET pushpull_torch)
  install(TARGETS pushpull_torch EXPORT pushpullTorchTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/integrations/torch/include/pushpull
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT pushpullTorchTargets NAMESPACE pushpull:: DESTINATION ${PUSHPULL_CMAKE_DIR})
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pushpullConfig.cmake.in
  ${PROJECT_BINARY_DIR}/pushpullConfig.cmake INSTALL_DESTINATION ${PUSHPULL_CMAKE_DIR})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pushpullConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pushpullConfig.cmake ${PROJECT_BINARY_DIR}/pushpullConfigVersion.cmake
  DESTINATION ${PUSHPULL_CMAKE_DIR})

# pushpull.pc: relocatable (prefix from the .pc file's own place), so an
# install with `--prefix` or an extracted .deb works without editing it.
file(RELATIVE_PATH PUSHPULL_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
if(TARGET pushpull_shared)
  set(PUSHPULL_PC_LIBS "-lpushpull")
  set(PUSHPULL_PC_REQUIRES "fmt")
  set(PUSHPULL_PC_REQUIRES_PRIVATE "libssl libcrypto zlib")
else()
  list(TRANSFORM PUSHPULL_STATIC_LINK_ORDER PREPEND -lpushpull_ OUTPUT_VARIABLE _libs)
  list(JOIN _libs " " PUSHPULL_PC_LIBS)
  set(PUSHPULL_PC_REQUIRES "fmt libcrypto zlib")
  set(PUSHPULL_PC_REQUIRES_PRIVATE "")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/pushpull.pc.in ${PROJECT_BINARY_DIR}/pushpull.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pushpull.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/CHANGELOG.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR})

# `make package` / `cmake --build build --target package`: build/pushpull_<version>_<arch>.deb.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME pushpull)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "Data-parallel distributed training: parameter server and collectives (library, headers, CLI)")
set(CPACK_PACKAGE_CONTACT "pushpull developers <pushpull@invalid>")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
# Runtime libraries from dpkg-shlibdeps; the headers need fmt's, and static
# linking needs libcrypto's and zlib's development packages.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libfmt-dev, libssl-dev, zlib1g-dev")
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/package)
include(CPack)
