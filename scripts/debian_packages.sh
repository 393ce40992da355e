# shellcheck shell=bash
# Sourced by scripts/setup.sh and scripts/torch_ref.sh: installs the Debian packages a script
# needs when dpkg does not list them as installed (apt-get, non-interactively, as root or
# through sudo).

# install_missing_packages WHO PKG...: installs those of PKG... that are missing, WHO naming
# the caller in messages; leaves their names in the array missing_packages (empty: none was).
install_missing_packages() {
  local who="$1" pkg status
  shift
  missing_packages=()
  for pkg in "$@"; do
    status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
    [[ "$status" == "installed" ]] || missing_packages+=("$pkg")
  done
  ((${#missing_packages[@]} > 0)) || return 0
  echo "$who: installing ${missing_packages[*]}"
  local as_root=()
  if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null; then
      echo "$who: need root (or sudo) to install: ${missing_packages[*]}" >&2
      exit 1
    fi
    as_root=(sudo)
  fi
  "${as_root[@]}" apt-get update
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing_packages[@]}"
}
