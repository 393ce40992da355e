# Launching without mpirun (included by ../CMakeLists.txt): dist::spawn inside a test program
# (spawn_main.cpp, one ctest entry per test: every worker runs its test again up to spawn()),
# and the ember-run launcher (launch_tests.sh) with a worker program of its own
# (launch_worker_main.cpp): local jobs, two launchers on loopback as two nodes, restarts after
# a SIGKILL that must resume bit for bit, failures, signals and the job secret.
add_executable(ember_dist_spawn ${CMAKE_CURRENT_LIST_DIR}/spawn_main.cpp)
target_link_libraries(ember_dist_spawn PRIVATE ember::ember ember_warnings GTest::gtest_main)
add_dependencies(ember_dist_tests ember_dist_spawn)
gtest_discover_tests(ember_dist_spawn DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "dist;tcp;launch"
                     TIMEOUT 60 PROCESSORS 3
                     ENVIRONMENT "RANK=;WORLD_SIZE=;LOCAL_RANK=;MASTER_ADDR=;MASTER_PORT=;EMBER_JOB_SECRET=;EMBER_JOB_SECRET_FILE=")
