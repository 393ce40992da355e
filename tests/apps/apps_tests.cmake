# ember-train's tests (included by ../CMakeLists.txt once apps/ defined ember_train_core):
# the apps suite (schedule, trainer, metrics, and ember-train on a generated image folder),
# and gradient accumulation under DDP at 2 ranks.
ember_add_test_suite(apps ember_train_core)
# The programs under EMBER_TEST_BIN_DIR and the launcher script under EMBER_TEST_DATA_DIR when
# those are set (a moved copy of the tests), else where the build put them.
ember_test_file(ember_apps_tests EMBER_TRAIN_BIN EMBER_TEST_BIN_DIR $<TARGET_FILE_DIR:ember-train>
                $<TARGET_FILE_NAME:ember-train>)
ember_test_file(ember_apps_tests EMBER_TORCHRUN_STYLE EMBER_TEST_DATA_DIR ${CMAKE_CURRENT_SOURCE_DIR}
                dist/torchrun_style.sh)
add_dependencies(ember_apps_tests ember-train)
if(TARGET ember-run)
  # Snapshots: ember-train restarted by ember-run after a worker is killed.
  ember_test_file(ember_apps_tests EMBER_RUN_BIN EMBER_TEST_BIN_DIR $<TARGET_FILE_DIR:ember-run>
                  $<TARGET_FILE_NAME:ember-run>)
  add_dependencies(ember_apps_tests ember-run)
endif()

if(TARGET ember_dist AND MPIEXEC_EXECUTABLE)
  add_executable(ember_apps_ddp_accum ${CMAKE_CURRENT_LIST_DIR}/ddp_accum_main.cpp)
  target_link_libraries(ember_apps_ddp_accum PRIVATE ember_train_core ember_warnings)
  add_test(NAME apps_ddp_accum_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${MPIEXEC_NUMPROC_FLAG}
                   2 $<TARGET_FILE:ember_apps_ddp_accum>)
  set_tests_properties(apps_ddp_accum_np2 PROPERTIES TIMEOUT 120 LABELS "apps;mpi" PROCESSORS 2)
  # Snapshots: 2 ranks started by mpirun resume mid-epoch exactly.
  add_test(NAME apps_snapshots_mpirun_np2
           COMMAND ember_apps_tests --gtest_filter=Snapshots.TwoMpiRanks*)
  set_tests_properties(
    apps_snapshots_mpirun_np2
    PROPERTIES ENVIRONMENT
               "EMBER_TEST_MPIRUN_NP=${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${MPIEXEC_NUMPROC_FLAG}"
               TIMEOUT 120 LABELS "apps;mpi" PROCESSORS 2)
  # A GPT on 2 ranks under mpirun, resumed under ember-run.
  add_test(NAME apps_gpt_mpirun_np2 COMMAND ember_apps_tests --gtest_filter=GptTrain.TwoRanks*)
  set_tests_properties(
    apps_gpt_mpirun_np2
    PROPERTIES ENVIRONMENT
               "EMBER_TEST_MPIRUN_NP=${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${MPIEXEC_NUMPROC_FLAG}"
               TIMEOUT 180 LABELS "apps;mpi" PROCESSORS 2)
endif()
