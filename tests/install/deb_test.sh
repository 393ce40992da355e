#!/usr/bin/env bash
# The Debian packages: built from the build folder with cpack -G DEB, checked (names, versioned
# libraries, Depends from dpkg-shlibdeps, what goes where), unpacked into a throwaway root with
# dpkg -x, the consumer program built against that root with the README's CMake snippet and
# with pkg-config and run, ember-train --version run from it, and lintian run on both packages
# (errors fail the test, warnings are printed).
#   deb_test.sh <build dir> <version>
# Exits 77 (skipped) where dpkg-shlibdeps, lintian or file are missing (scripts/setup.sh
# installs them).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build_dir="$(cd "${1:?build dir}" && pwd)"
version="${2:?version}"
fail() {
  echo "deb_test.sh: $*" >&2
  exit 1
}

for tool in dpkg-shlibdeps dpkg-deb lintian file readelf; do
  if ! command -v "$tool" >/dev/null; then
    echo "deb_test.sh: skipped: $tool is missing (bash scripts/setup.sh --deps-only installs it)"
    exit 77
  fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/ember-deb-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT

cpack --config "$build_dir/CPackConfig.cmake" -G DEB -B "$work/out" >"$work/cpack.log" 2>&1 || {
  cat "$work/cpack.log" >&2
  fail "cpack -G DEB failed"
}
arch="$(dpkg --print-architecture)"
runtime="$work/out/ember_${version}_${arch}.deb"
dev="$work/out/ember-dev_${version}_${arch}.deb"
[[ -f "$runtime" && -f "$dev" ]] || fail "cpack made $(ls "$work/out"), not ember_ and ember-dev_${version}_${arch}.deb"

# Control fields: the runtime package's Depends are dpkg-shlibdeps' (libc6, libstdc++6 and
# Open MPI's library package at least); ember-dev depends on exactly this ember.
depends="$(dpkg-deb -f "$runtime" Depends)"
echo "ember Depends: $depends"
for needed in 'libc6 \(>= ' 'libstdc\+\+6 \(>= ' 'libopenmpi[0-9]+ '; do
  grep -q -E "(^|, )$needed" <<<"$depends" || fail "ember's Depends lack $needed: $depends"
done
dev_depends="$(dpkg-deb -f "$dev" Depends)"
grep -q -F "ember (= $version)" <<<"$dev_depends" || fail "ember-dev's Depends lack ember (= $version): $dev_depends"
[[ "$(dpkg-deb -f "$runtime" Version)" == "$version" ]] || fail "ember's Version is not $version"

# What goes where: versioned libraries in ember, their unversioned links in ember-dev.
dpkg-deb -c "$runtime" >"$work/runtime.list"
dpkg-deb -c "$dev" >"$work/dev.list"
for library in tensor autograd nn optim data dist apps; do
  grep -q -E "\./usr/lib/libember_$library\.so\.$version\$" "$work/runtime.list" ||
    fail "ember lacks usr/lib/libember_$library.so.$version"
  grep -q -E "\./usr/lib/libember_$library\.so -> libember_$library\.so\.${version%%.*}\$" "$work/dev.list" ||
    fail "ember-dev lacks the link usr/lib/libember_$library.so"
done
grep -q -E '\./usr/bin/ember-train$' "$work/runtime.list" || fail "ember lacks usr/bin/ember-train"
grep -q -E '\./usr/bin/ember-run$' "$work/runtime.list" || fail "ember lacks usr/bin/ember-run"
for file in usr/include/ember/ember.h usr/include/ember/tensor/version.h usr/include/ember/apps/trainer.h \
  usr/lib/cmake/Ember/EmberConfig.cmake \
  usr/lib/cmake/Ember/EmberConfigVersion.cmake usr/lib/pkgconfig/ember.pc; do
  grep -q -E "\./$file\$" "$work/dev.list" || fail "ember-dev lacks $file"
done
if grep -q -E '\./usr/include/|\.so -> ' "$work/runtime.list"; then fail "ember holds development files"; fi

# apt can install both here: their Depends are met by this machine's packages (a simulation,
# nothing is installed).
if command -v apt-get >/dev/null; then
  apt-get install -s "$runtime" "$dev" >"$work/apt.log" 2>&1 || {
    cat "$work/apt.log" >&2
    fail "apt-get install -s of the packages fails"
  }
  grep -q -E '^Conf ember-dev ' "$work/apt.log" || fail "apt-get install -s does not configure ember-dev"
fi

# Unpacked as apt would install them, in a root of their own.
dpkg -x "$runtime" "$work/root"
dpkg -x "$dev" "$work/root"
soname="$(readelf -d "$work/root/usr/lib/libember_tensor.so.$version" | sed -n -E 's/.*\(SONAME\).*\[(.*)\]/\1/p')"
[[ "$soname" == "libember_tensor.so.${version%%.*}" ]] || fail "libember_tensor's SONAME is '$soname'"
bash "$here/consumer_test.sh" ember-train "$work/root/usr" "$version"
bash "$here/consumer_test.sh" cmake "$work/root/usr" "$version"
bash "$here/consumer_test.sh" pkg-config "$work/root/usr" "$version"

# lintian: errors fail the test; warnings are listed.
lintian_status=0
lintian --fail-on error "$runtime" "$dev" >"$work/lintian.log" 2>&1 || lintian_status=$?
grep -v 'running with root privileges' "$work/lintian.log" || true
((lintian_status == 0)) || fail "lintian reports errors (status $lintian_status)"
echo "Debian packages: built, unpacked, consumer built against them, lintian without errors"
