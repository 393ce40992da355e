#!/usr/bin/env bash
# Downloads CIFAR-10 (binary version) from its official address, checks its MD5 and
# unpacks it, so that ember's Cifar10 dataset finds FOLDER/cifar-10-batches-bin/.
#
#   bash scripts/fetch_cifar10.sh FOLDER
#
# Where the network is not reachable it says where to put the files instead. The tests
# never call it.
set -euo pipefail

url="https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
md5="c32a1d4ab5d03f1284b67883e8d87530"
archive_name="cifar-10-binary.tar.gz"

if [[ $# -ne 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  [[ $# -eq 1 ]] && exit 0 || exit 2
fi
folder="$1"
mkdir -p "$folder"
folder="$(cd "$folder" && pwd)"

manual_steps() {
  cat >&2 <<MSG
fetch_cifar10.sh: $1
Get the data by hand on a machine with network access:
  1. download $url
  2. check: md5sum $archive_name  ->  $md5
  3. unpack: tar -xzf $archive_name -C $folder
     (or copy $archive_name into $folder and run this script again: it checks and unpacks it)
Afterwards $folder/cifar-10-batches-bin/ holds data_batch_1.bin ... data_batch_5.bin and
test_batch.bin, and ember reads it with ember::data::Cifar10("$folder", ...).
MSG
  exit 1
}

if [[ -f "$folder/cifar-10-batches-bin/test_batch.bin" && -f "$folder/cifar-10-batches-bin/data_batch_5.bin" ]]; then
  echo "fetch_cifar10.sh: $folder/cifar-10-batches-bin is already there"
  exit 0
fi

archive="$folder/$archive_name"
if [[ ! -f "$archive" ]]; then
  partial="$archive.part"
  if command -v curl >/dev/null; then
    curl -fL --connect-timeout 20 --retry 2 -o "$partial" "$url" ||
      { rm -f "$partial"; manual_steps "could not download $url (no network?)"; }
  elif command -v wget >/dev/null; then
    wget -T 20 -t 2 -O "$partial" "$url" ||
      { rm -f "$partial"; manual_steps "could not download $url (no network?)"; }
  else
    manual_steps "neither curl nor wget is installed"
  fi
  mv "$partial" "$archive"
fi

actual="$(md5sum "$archive" | cut -d' ' -f1)"
if [[ "$actual" != "$md5" ]]; then
  rm -f "$archive"
  manual_steps "$archive_name has MD5 $actual, expected $md5 (corrupt download, removed)"
fi
tar -xzf "$archive" -C "$folder"
rm -f "$archive"
echo "fetch_cifar10.sh: CIFAR-10 is in $folder/cifar-10-batches-bin"
