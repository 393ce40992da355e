#!/usr/bin/env bash
# An installed ember as a user's project meets it. Each mode is one CTest entry:
#
#   consumer_test.sh install       BUILD_DIR PREFIX   cmake --install into PREFIX (emptied first)
#   consumer_test.sh cmake         PREFIX VERSION     the README's CMake snippet, copied verbatim
#                                                     from README.md, configured without any
#                                                     CMAKE_CXX_STANDARD, built and run
#   consumer_test.sh cmake-strict  PREFIX VERSION     the same with -Wall -Wextra -Wshadow -Werror
#                                                     and ember's headers on plain -I (no -isystem)
#   consumer_test.sh pkg-config    PREFIX VERSION     g++ main.cpp $(pkg-config --cflags --libs ember)
#   consumer_test.sh config-errors PREFIX VERSION     find_package(Ember) refuses another major
#                                                     version and names a missing dependency
#   consumer_test.sh ember-train   PREFIX VERSION     the installed ember-train --version
#
# PREFIX holds include/ember and lib*/cmake/Ember (a `cmake --install` prefix, or usr/ of an
# unpacked Debian package); VERSION is the version ember was built as. The program built is
# consumer/main.cpp beside this script, which checks its answers.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source_dir="$(cd "$here/../.." && pwd)"
fail() {
  echo "consumer_test.sh $mode: $*" >&2
  exit 1
}

mode="${1:?usage: consumer_test.sh MODE ...}"
if [[ "$mode" == install ]]; then
  build_dir="${2:?build dir}"
  prefix="${3:?prefix}"
  rm -rf "$prefix"
  cmake --install "$build_dir" --prefix "$prefix" >/dev/null
  test -f "$prefix/include/ember/ember.h" || fail "no include/ember/ember.h under $prefix"
  echo "ember installed into $prefix"
  exit 0
fi
prefix="$(cd "${2:?prefix}" && pwd)"
version="${3:?version}"
work="$(mktemp -d "${TMPDIR:-/tmp}/ember-consumer.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# The README's snippet: the first ```cmake block of its "Using ember from your own CMake
# project" section, as it stands.
readme_snippet() {
  awk '
    /^## / { in_section = ($0 == "## Using ember from your own CMake project") }
    in_section && /^```cmake *$/ { in_block = 1; next }
    in_block && /^```/ { exit }
    in_block { print }' "$source_dir/README.md"
}

# Writes a consumer project into $work/project from the README's snippet, with main.cpp under
# the name the snippet gives its source; sets $target.
write_project() {
  local snippet
  snippet="$(readme_snippet)"
  [[ -n "$snippet" ]] || fail "README.md has no \`\`\`cmake block under 'Using ember from your own CMake project'"
  if grep -q -E 'CMAKE_CXX_STANDARD|cxx_std_|CXX_STANDARD' <<<"$snippet"; then
    fail "the README's snippet sets a C++ standard itself; it must build with what Ember::ember carries"
  fi
  local source
  read -r target source < <(sed -n -E 's/^[[:space:]]*add_executable\(([^ )]+)[[:space:]]+([^ )]+)\).*/\1 \2/p' <<<"$snippet")
  [[ -n "${target:-}" && -n "${source:-}" ]] || fail "no add_executable(TARGET SOURCE) in the README's snippet"
  mkdir -p "$work/project"
  cp "$here/consumer/main.cpp" "$work/project/$source"
  {
    echo "cmake_minimum_required(VERSION 3.25)"
    echo "project(ember_readme_consumer CXX)"
    echo "# --- README.md's snippet, verbatim ---"
    echo "$snippet"
    echo "# --- end of README.md's snippet ---"
  } >"$work/project/CMakeLists.txt"
}

configure() {
  cmake -S "$work/project" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "$@"
}

case "$mode" in
  cmake | cmake-strict)
    write_project
    configure_args=()
    if [[ "$mode" == cmake-strict ]]; then
      echo "target_compile_options($target PRIVATE -Wall -Wextra -Wshadow -Werror)" \
        >>"$work/project/CMakeLists.txt"
      # Imported targets' include directories as plain -I: warnings in ember's headers count.
      configure_args=(-DCMAKE_NO_SYSTEM_FROM_IMPORTED=ON)
    fi
    configure "${configure_args[@]}" >"$work/configure.log" 2>&1 || {
      cat "$work/configure.log" >&2
      fail "configuring the README's snippet against $prefix failed"
    }
    cmake --build "$work/build" || fail "building the README's snippet against $prefix failed"
    commands="$work/build/compile_commands.json"
    # No standard was asked for by the project: C++20 comes from Ember::ember.
    grep -q -E -- '-std=(gnu|c)\+\+(20|2a)' "$commands" || fail "no -std=c++20 from Ember::ember in $commands"
    if [[ "$mode" == cmake-strict ]]; then
      grep -q -- "-I$prefix/include" "$commands" || fail "ember's headers are not on a plain -I in $commands"
      if grep -q -- "-isystem" "$commands"; then fail "a -isystem include in $commands"; fi
    fi
    "$work/build/$target"
    ;;
  pkg-config)
    pc="$(find "$prefix" -name ember.pc -path '*/pkgconfig/*' | head -1)"
    [[ -n "$pc" ]] || fail "no pkgconfig/ember.pc under $prefix"
    PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export PKG_CONFIG_PATH
    pkg-config --exists --print-errors ember
    [[ "$(pkg-config --modversion ember)" == "$version" ]] ||
      fail "pkg-config --modversion ember says $(pkg-config --modversion ember), not $version"
    libdir="$(pkg-config --variable=libdir ember)"
    [[ "$(cd "$libdir" && pwd)" == "$(cd "$(dirname "$pc")/.." && pwd)" ]] ||
      fail "ember.pc's libdir $libdir is not where ember.pc lies ($pc)"
    cflags="$(pkg-config --cflags ember)"
    libs="$(pkg-config --libs ember)"
    echo "g++ main.cpp $cflags $libs"
    # shellcheck disable=SC2086 # the flags are words
    g++ "$here/consumer/main.cpp" -o "$work/consumer" $cflags $libs
    LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer"
    ;;
  config-errors)
    major="${version%%.*}"
    rest="${version#*.}"
    minor="${rest%%.*}"
    # Same major, this minor: found; the next major: refused, naming the version installed.
    write_project
    sed -i -E "s/find_package\(Ember /find_package(Ember $major.$minor /" "$work/project/CMakeLists.txt"
    configure >"$work/same.log" 2>&1 || {
      cat "$work/same.log" >&2
      fail "find_package(Ember $major.$minor) did not accept Ember $version"
    }
    rm -rf "$work/project" "$work/build"
    write_project
    sed -i -E "s/find_package\(Ember /find_package(Ember $((major + 1)).0 /" "$work/project/CMakeLists.txt"
    if configure >"$work/next.log" 2>&1; then fail "find_package(Ember $((major + 1)).0) accepted Ember $version"; fi
    tr -s ' \n' '  ' <"$work/next.log" | grep -q "version: $version" || {
      cat "$work/next.log" >&2
      fail "refusing Ember $version for $((major + 1)).0 does not name the version installed"
    }
    # A dependency of the exported targets missing (MPI hidden): Ember is not found, and the
    # message says which and what to install.
    rm -rf "$work/project" "$work/build"
    write_project
    if configure -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >"$work/mpi.log" 2>&1; then
      fail "Ember was found with MPI hidden"
    fi
    # (CMake wraps the message: its words are compared with the lines joined.)
    said="$(tr -s ' \n' '  ' <"$work/mpi.log")"
    if ! grep -q "needs MPI, which was not found" <<<"$said" || ! grep -q "libopenmpi-dev" <<<"$said"; then
      cat "$work/mpi.log" >&2
      fail "with MPI missing, find_package(Ember) does not say it needs MPI and what to install"
    fi
    echo "find_package(Ember): $major.$minor accepted, $((major + 1)).0 refused, missing MPI named"
    ;;
  ember-train)
    out="$("$prefix/bin/ember-train" --version)"
    [[ "$out" == "ember-train $version" ]] || fail "ember-train --version printed '$out', not 'ember-train $version'"
    echo "$out"
    ;;
  *) fail "unknown mode (install, cmake, cmake-strict, pkg-config, config-errors, ember-train)" ;;
esac
