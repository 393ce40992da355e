# Sourced by scripts/setup.sh and scripts/train.sh: each phase of the set-up says what it does
# when it starts and how long it took when it ends, e.g.
#   ==> build: ember-train and the libraries it links in build-train/
#   ...
#   ==> build: done in 131.2 s (118 targets built)

# Microseconds since the epoch (bash 5's EPOCHREALTIME, whatever the locale's decimal mark).
phase_clock() { echo "${EPOCHREALTIME//[!0-9]/}"; }

# "131.2 s" for the microseconds since $1.
phase_seconds_since() {
  local us=$(($(phase_clock) - $1))
  echo "$((us / 1000000)).$((us / 100000 % 10)) s"
}

# phase NAME WHAT: starts the phase NAME, saying WHAT it does.
phase() {
  phase_name="$1"
  phase_start="$(phase_clock)"
  echo "==> $1: $2"
}

# phase_done [NOTE]: ends the current phase with its time (and NOTE).
phase_done() {
  echo "==> $phase_name: done in $(phase_seconds_since "$phase_start")${1:+ ($1)}"
}
