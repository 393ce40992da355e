// ember-flight: reads the flight-recorder dumps of a job (one rank<R>.json per rank, written
// by ember's process groups when a collective timed out or a group broke, on SIGUSR1, or on
// request; see <ember/dist/flight_recorder.h>) and says where its ranks were: the last
// collective all completed, the first number where they disagree, who waits where and who
// never arrived. For jobs started by mpirun or srun; ember-run runs the same analysis itself
// after a failed job.
//   ember-flight [DIR]     (default: EMBER_FLIGHT_DIR, else ./ember-flight)
#include <cstdio>
#include <exception>
#include <string>

#include <ember/dist/flight_recorder.h>

int main(int argc, char** argv) {
  if (argc > 2 ||
      (argc == 2 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help"))) {
    std::fprintf(stderr,
                 "usage: ember-flight [DIR]\n"
                 "Reads the flight-recorder dumps DIR/rank<R>.json of one job (default: "
                 "EMBER_FLIGHT_DIR, else ./ember-flight) and says where its ranks were.\n");
    return argc == 2 ? 0 : 2;
  }
  const std::string dir = argc == 2 ? argv[1] : ember::dist::flight_recorder_dir();
  try {
    std::printf("%s\n", ember::dist::analyze_flight_dumps(dir).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ember-flight: %s\n", e.what());
    return 1;
  }
}
