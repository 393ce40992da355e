# Launching without mpirun (included by ../CMakeLists.txt): dist::spawn inside a test program
# (spawn_main.cpp, one ctest entry per test: every worker runs its test again up to spawn()),
# and the ember-run launcher (launch_tests.sh) with a worker program of its own
# (launch_worker_main.cpp): local jobs, two launchers on loopback as two nodes, restarts after
# a SIGKILL that must resume bit for bit, failures, signals and the job secret.
add_executable(ember_dist_spawn ${CMAKE_CURRENT_LIST_DIR}/spawn_main.cpp)
target_link_libraries(ember_dist_spawn PRIVATE ember::ember ember_warnings GTest::gtest_main)
add_dependencies(ember_dist_tests ember_dist_spawn)
# gtest_add_tests (tests found in the source at configure time) rather than discovery: the
# properties below are lists.
gtest_add_tests(TARGET ember_dist_spawn SOURCES ${CMAKE_CURRENT_LIST_DIR}/spawn_main.cpp
                TEST_LIST ember_spawn_tests)
set_tests_properties(${ember_spawn_tests} PROPERTIES LABELS "dist;tcp;launch" TIMEOUT 60
  PROCESSORS 3 ENVIRONMENT
  "RANK=;WORLD_SIZE=;LOCAL_RANK=;MASTER_ADDR=;MASTER_PORT=;EMBER_JOB_SECRET=;EMBER_JOB_SECRET_FILE=")

add_executable(ember_dist_launch_worker ${CMAKE_CURRENT_LIST_DIR}/launch_worker_main.cpp)
target_link_libraries(ember_dist_launch_worker PRIVATE ember::ember ember_warnings)
add_dependencies(ember_dist_tests ember_dist_launch_worker)

set(EMBER_LAUNCH_TESTS bash ${CMAKE_CURRENT_LIST_DIR}/launch_tests.sh)
foreach(case local2 local3 nodes nodes_secret_required nodes_wrong_secret
             nodes_bad_program node_launcher_killed restart restart_nodes fail fail_nodes
             sigterm sigint launcher_killed secret)
  add_test(NAME dist_ember_run_${case}
    COMMAND ${EMBER_LAUNCH_TESTS} ${case} $<TARGET_FILE:ember-run>
            $<TARGET_FILE:ember_dist_launch_worker>)
  set_tests_properties(dist_ember_run_${case} PROPERTIES TIMEOUT 120 LABELS "dist;tcp;launch"
                                                         PROCESSORS 3)
endforeach()
# OMP_NUM_THREADS and ember's thread count inside the workers: ember-run's share, or the user's.
add_test(NAME dist_ember_run_threads
  COMMAND ${EMBER_LAUNCH_TESTS} threads $<TARGET_FILE:ember-run>
          $<TARGET_FILE:ember_dist_launch_worker>)
set_tests_properties(dist_ember_run_threads PROPERTIES TIMEOUT 120 LABELS "dist;tcp;launch"
                                                       PROCESSORS 3)
if(TARGET ember-train)
  add_test(NAME dist_ember_run_train
    COMMAND ${EMBER_LAUNCH_TESTS} train $<TARGET_FILE:ember-run>
            $<TARGET_FILE:ember_dist_launch_worker> $<TARGET_FILE:ember-train>)
  set_tests_properties(dist_ember_run_train PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                                                       LABELS "dist;tcp;launch;apps" PROCESSORS 2)
endif()

# Elastic ember-run (--nnodes MIN:MAX): a node lost by heartbeat and a node joining, a node
# leaving on SIGTERM or when its program cannot start, a spare, the master launcher's node
# lost, and the refused settings.
foreach(case elastic elastic_leave elastic_bad_program elastic_spare elastic_master_lost
             elastic_args)
  add_test(NAME dist_ember_run_${case}
    COMMAND ${EMBER_LAUNCH_TESTS} ${case} $<TARGET_FILE:ember-run>
            $<TARGET_FILE:ember_dist_launch_worker>)
  set_tests_properties(dist_ember_run_${case} PROPERTIES TIMEOUT 90 LABELS "dist;tcp;launch"
                                                         PROCESSORS 3)
endforeach()
