# The dist suite on the TCP backend (included by mpi_tests.cmake): ranks started torchrun-style
# by torchrun_style.sh (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; no mpirun) at 2
# and 3 ranks, jobs that must fail cleanly, and ember-train on the CPU over TCP.
set(EMBER_TORCHRUN bash ${CMAKE_CURRENT_LIST_DIR}/torchrun_style.sh)
foreach(np 2 3)
  add_test(NAME dist_tcp_np${np}
    COMMAND ${EMBER_TORCHRUN} ${np} $<TARGET_FILE:ember_dist_tests>)
  set_tests_properties(dist_tcp_np${np} PROPERTIES TIMEOUT 300 ENVIRONMENT EMBER_TEST_BACKEND=tcp
                                                   LABELS "dist;tcp" PROCESSORS ${np})
endforeach()

add_test(NAME dist_tcp_failure_skip
  COMMAND ${EMBER_EXPECT_FAILURE} 60 "allreduce #2 on rank 0 timed out after 2000 ms"
    ${EMBER_TORCHRUN} 2 $<TARGET_FILE:ember_dist_failure> skip tcp)
add_test(NAME dist_tcp_failure_exit
  COMMAND ${EMBER_EXPECT_FAILURE} 60 "allreduce #2 on rank 0: rank 1 closed its connection"
    ${EMBER_TORCHRUN} 2 $<TARGET_FILE:ember_dist_failure> exit tcp)
foreach(mode caught unwound)
  add_test(NAME dist_tcp_failure_${mode}
    COMMAND ${EMBER_EXPECT_FAILURE} 60 "barrier #1 on rank 1 timed out after 3000 ms"
      ${EMBER_TORCHRUN} 2 $<TARGET_FILE:ember_dist_failure> ${mode} tcp)
endforeach()
# A collective save_checkpoint on rank 0 alone while rank 1 all-reduces: both ranks name both
# calls at once.
add_test(NAME dist_tcp_failure_save_alone
  COMMAND ${EMBER_EXPECT_FAILURE} 30
    "rank 0: failed within 5 s .*rank 0 issued allgather #2 .*; rank 1 issued allreduce #2"
    --and "rank 1: failed within 5 s .*rank 0 issued allgather #2 .*; rank 1 issued allreduce #2"
    ${EMBER_TORCHRUN} 2 $<TARGET_FILE:ember_dist_failure> save_alone tcp)
set_tests_properties(dist_tcp_failure_skip dist_tcp_failure_exit dist_tcp_failure_caught
  dist_tcp_failure_unwound dist_tcp_failure_save_alone PROPERTIES
  TIMEOUT 120 LABELS "dist;tcp" PROCESSORS 2)

# The flight recorder: rank 1 hangs in its own code (failure_main skip) under ember-run, which
# prints the dumps' analysis once rank 0's allreduce #2 timed out: rank 0's dump (written at
# the timeout) and rank 1's (asked for through the store) name who waits and who never came.
add_test(NAME dist_tcp_flight_hang
  COMMAND ${CMAKE_COMMAND} -E env EMBER_FLIGHT_DIR=${CMAKE_CURRENT_BINARY_DIR}/flight_hang
    ${EMBER_EXPECT_FAILURE} 60
    "every rank that dumped completed allreduce #1 .f32 x 1024, 4.0 KiB."
    --and "The ranks disagree at #2: rank 0 issued allreduce #2 .f32 x 1024, 4.0 KiB.. rank 1 never issued #2"
    --and "rank 0 waits in allreduce #2 .f32 x 1024, 4.0 KiB. since 2.. s. rank 1 is outside any collective: its last, allreduce #1 .f32 x 1024, 4.0 KiB., completed"
    $<TARGET_FILE:ember-run> --nproc-per-node 2 --grace 2 $<TARGET_FILE:ember_dist_failure> skip tcp)
# Mismatched calls at 3 ranks: the dumps every rank writes at the mismatch say what the errors
# say (ember-flight, as after an mpirun job).
set(EMBER_FLIGHT_JOB bash ${CMAKE_CURRENT_LIST_DIR}/flight_job.sh)
add_test(NAME dist_tcp_flight_mismatch
  COMMAND ${EMBER_EXPECT_FAILURE} 60
    "ranks 0, 1 issued allreduce #2 on f32 .1024. .sum.. rank 2 issued broadcast #2"
    --and "The ranks disagree at #2: ranks 0, 1 issued allreduce #2 .f32 x 1024, 4.0 KiB., while rank 2 issued broadcast #2 .f32 x 1024, 4.0 KiB, root 0."
    ${EMBER_FLIGHT_JOB} ${CMAKE_CURRENT_BINARY_DIR}/flight_mismatch $<TARGET_FILE:ember-flight>
    ${EMBER_TORCHRUN} 3 $<TARGET_FILE:ember_dist_failure> other_op tcp)
set_tests_properties(dist_tcp_flight_hang dist_tcp_flight_mismatch PROPERTIES TIMEOUT 120
                     LABELS "dist;tcp" PROCESSORS 3)

foreach(np 2 3)
  ember_add_odd_one_out(dist_tcp_failure ${np} tcp ${EMBER_TORCHRUN} ${np}
    $<TARGET_FILE:ember_dist_failure>)
endforeach()

if(TARGET ember-train)
  add_test(NAME train_tcp_np2
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_tcp.sh $<TARGET_FILE:ember-train>
            ${CMAKE_CURRENT_BINARY_DIR}/train_tcp_np2)
  set_tests_properties(train_tcp_np2 PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                                                LABELS "dist;tcp;apps" PROCESSORS 2)
endif()

# Strangers at a live TCP job (store_strangers.sh): a protocol fuzzer with 200 idle
# connections against a 2-rank job, and an intruder with a wrong job secret or none against
# jobs of 2 and 3 ranks that have one.
add_executable(ember_dist_stranger ${CMAKE_CURRENT_LIST_DIR}/stranger_main.cpp)
target_link_libraries(ember_dist_stranger PRIVATE ember::ember ember_warnings)
add_dependencies(ember_dist_tests ember_dist_stranger)
set(EMBER_STRANGERS bash ${CMAKE_CURRENT_LIST_DIR}/store_strangers.sh)
add_test(NAME dist_tcp_store_fuzz_np2
  COMMAND ${EMBER_STRANGERS} fuzz 2 $<TARGET_FILE:ember_dist_stranger>)
set_tests_properties(dist_tcp_store_fuzz_np2 PROPERTIES TIMEOUT 180 LABELS "dist;tcp"
                                                        PROCESSORS 3)
foreach(np 2 3)
  add_test(NAME dist_tcp_job_secret_np${np}
    COMMAND ${EMBER_STRANGERS} secret ${np} $<TARGET_FILE:ember_dist_stranger>)
  set_tests_properties(dist_tcp_job_secret_np${np} PROPERTIES TIMEOUT 180 LABELS "dist;tcp"
                                                              PROCESSORS ${np})
endforeach()

# init_process_group's init_method (init_method_main.cpp): env://, tcp:// and file:// at 2 and 3
# ranks forked on loopback with explicit rank and world size; bad URLs, world size mismatches
# and a stale file:// refused within the timeout.
add_executable(ember_dist_init_method ${CMAKE_CURRENT_LIST_DIR}/init_method_main.cpp)
target_link_libraries(ember_dist_init_method PRIVATE ember::ember ember_warnings GTest::gtest_main)
add_dependencies(ember_dist_tests ember_dist_init_method)
add_test(NAME dist_init_method COMMAND $<TARGET_FILE:ember_dist_init_method>)
set_tests_properties(dist_init_method PROPERTIES TIMEOUT 240 LABELS "dist;tcp" PROCESSORS 3
                     ENVIRONMENT "RANK=;WORLD_SIZE=;LOCAL_RANK=;MASTER_ADDR=;MASTER_PORT=")
add_test(NAME dist_init_method_mpirun_np2
  COMMAND ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:ember_dist_init_method>
          --gtest_filter=UnderMpirun.*)
set_tests_properties(dist_init_method_mpirun_np2 PROPERTIES TIMEOUT 120 LABELS "dist;mpi"
                                                           PROCESSORS 2)

# A sharded snapshot saved by 3 ranks and loaded by 2, 4 and 1, each a torchrun-style job
# (sharded_resize.sh): equal values, every element read once, bounded memory on load.
add_executable(ember_sharded_resize ${CMAKE_CURRENT_LIST_DIR}/sharded_resize_main.cpp)
target_link_libraries(ember_sharded_resize PRIVATE ember::ember ember_warnings)
add_dependencies(ember_dist_tests ember_sharded_resize)
add_test(NAME dist_tcp_sharded_resize
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/sharded_resize.sh $<TARGET_FILE:ember_sharded_resize>)
set_tests_properties(dist_tcp_sharded_resize PROPERTIES TIMEOUT 180 LABELS "dist;tcp"
                                                        PROCESSORS 4)
