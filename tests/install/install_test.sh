#!/usr/bin/env bash
# Builds and runs tests/install/consumer against pushpull the four ways a user
# gets it (docs/install.md):
#   package       cmake --install BUILD --prefix P; find_package(pushpull) with CMAKE_PREFIX_PATH=P
#   subdirectory  add_subdirectory(<source tree>) from the consumer project
#   pkgconfig     cmake --install; g++ $(pkg-config --cflags --libs pushpull)
#   deb           cpack's .deb extracted with dpkg-deb -x; its CLI and its pushpull.pc
#   torch         find_package(pushpull COMPONENTS torch), pushpull::torch (skipped without libtorch)
# Usage: install_test.sh MODE BUILD_DIR SOURCE_DIR. Work happens in
# BUILD_DIR/install-test/MODE (under the build tree so ccache can reuse objects).
set -euo pipefail
mode=$1
build=$(cd "$2" && pwd)
src=$(cd "$3" && pwd)
work=$build/install-test/$mode
# A sanitizer build (make sanitize) installs objects compiled with
# -fsanitize=...: a consumer built as a user builds it (no -fsanitize) cannot
# link them (undefined __asan_* / __ubsan_* symbols). `subdirectory` builds
# the library again with the consumer's flags, so it still runs.
if [[ -n ${PUSHPULL_TEST_SANITIZE:-} && $mode != subdirectory ]]; then
  echo "skipped: a sanitizer build (PUSHPULL_SANITIZE=$PUSHPULL_TEST_SANITIZE) installs objects" \
    "that need the sanitizer runtime, which a user's consumer does not link"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
consumer=$src/tests/install/consumer
want_version=$(sed -n 's/^project(pushpull VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

run_consumer() {  # run_consumer BINARY [LD_LIBRARY_PATH]
  local out
  out=$(LD_LIBRARY_PATH=${2:-} "$1")
  echo "$out"
  [[ $out == "consumer ok: pushpull $want_version" ]] || { echo "unexpected output from $1" >&2; exit 1; }
}

pkgconfig_consumer() {  # pkgconfig_consumer PKG_CONFIG_DIR LIB_DIR
  local flags
  flags=$(PKG_CONFIG_PATH=$1 pkg-config --cflags --libs pushpull)
  [[ $(PKG_CONFIG_PATH=$1 pkg-config --modversion pushpull) == "$want_version" ]]
  echo "pkg-config flags: $flags"
  # shellcheck disable=SC2086  # the flags are words
  g++ -O1 -o "$work/consumer_pc" "$consumer/main.cpp" $flags
  run_consumer "$work/consumer_pc" "$2"
}

case $mode in
  package)
    cmake --install "$build" --prefix "$work/prefix" >/dev/null
    for f in bin/pushpull include/pushpull/kvstore.h include/pushpull/build_info.h \
             lib/cmake/pushpull/pushpullConfig.cmake lib/cmake/pushpull/pushpullConfigVersion.cmake \
             lib/libpushpull.so lib/libpushpull_base.a lib/pkgconfig/pushpull.pc; do
      [[ -e $work/prefix/$f ]] || { echo "install lacks $f" >&2; exit 1; }
    done
    "$work/prefix/bin/pushpull" --version
    cmake -S "$consumer" -B "$work/consumer" "${generator[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
    cmake --build "$work/consumer" >/dev/null
    run_consumer "$work/consumer/consumer_static"
    # CMake puts the install's lib dir in the build RPATH.
    run_consumer "$work/consumer/consumer_shared"
    ;;
  subdirectory)
    cmake -S "$consumer" -B "$work/consumer" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DPUSHPULL_CONSUMER_MODE=subdirectory -DPUSHPULL_SOURCE_DIR="$src" \
      -DPUSHPULL_BUILD_TORCH=OFF >/dev/null
    # Only the library: tests, examples, benchmarks and Python default to OFF
    # for a project that is not the top level.
    if [[ -e $work/consumer/pushpull/tests ]]; then echo "tests configured in a subproject" >&2; exit 1; fi
    cmake --build "$work/consumer" -j 2 >/dev/null
    run_consumer "$work/consumer/consumer_static"
    run_consumer "$work/consumer/consumer_shared"
    ;;
  pkgconfig)
    cmake --install "$build" --prefix "$work/prefix" >/dev/null
    pkgconfig_consumer "$work/prefix/lib/pkgconfig" "$work/prefix/lib"
    ;;
  deb)
    command -v dpkg-deb >/dev/null || { echo "SKIP: dpkg-deb not installed"; exit 77; }
    cpack --config "$build/CPackConfig.cmake" -B "$work/package" >/dev/null
    deb=$(ls "$work"/package/pushpull_"$want_version"_*.deb)
    echo "built $deb"
    dpkg-deb -I "$deb" | grep -E '^ (Package|Version|Depends):'
    dpkg-deb -x "$deb" "$work/root"
    [[ $("$work/root/usr/bin/pushpull" --version) == "pushpull $want_version" ]]
    "$work/root/usr/bin/pushpull" info >/dev/null
    pkgconfig_consumer "$work/root/usr/lib/pkgconfig" "$work/root/usr/lib"
    ;;
  torch)
    # Only when this build has the libtorch integration.
    grep -q pushpullTorchTargets "$build/cmake_install.cmake" || { echo "SKIP: built without libtorch"; exit 77; }
    cmake --install "$build" --prefix "$work/prefix" >/dev/null
    [[ -e $work/prefix/lib/cmake/pushpull/pushpullTorchTargets.cmake ]]
    [[ -e $work/prefix/include/pushpull/torch/trainer.h ]]
    cmake -S "$src/tests/install/consumer_torch" -B "$work/consumer" "${generator[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
    cmake --build "$work/consumer" >/dev/null
    [[ $("$work/consumer/consumer_torch") == "consumer torch ok" ]]
    ;;
  *)
    echo "usage: $0 package|subdirectory|pkgconfig|deb|torch BUILD_DIR SOURCE_DIR" >&2
    exit 2
    ;;
esac
echo "install_test $mode: ok"
