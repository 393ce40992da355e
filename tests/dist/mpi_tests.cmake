# The dist suite under mpirun (included by ../CMakeLists.txt once ember_dist_tests exists):
# the whole suite at 2 and 3 ranks, and jobs that must fail cleanly instead of hanging.
set(EMBER_MPIRUN ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe)
foreach(np 2 3)
  add_test(NAME dist_mpi_np${np}
    COMMAND ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:ember_dist_tests>)
  set_tests_properties(dist_mpi_np${np} PROPERTIES TIMEOUT 300 LABELS "dist;mpi" PROCESSORS ${np})
endforeach()

# dist's headers as a PyTorch user writes C++ (designated initializers leaving fields out),
# compiled under -Wall -Wextra -Wshadow -Werror: building the dist tests builds it.
add_library(ember_dist_user_style OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/dist/user_style_headers.cpp)
target_link_libraries(ember_dist_user_style PRIVATE ember::ember)
target_compile_options(ember_dist_user_style PRIVATE -Wall -Wextra -Wshadow -Werror)
add_dependencies(ember_dist_tests ember_dist_user_style)

add_executable(ember_dist_failure ${CMAKE_CURRENT_SOURCE_DIR}/dist/failure_main.cpp)
target_link_libraries(ember_dist_failure PRIVATE ember::ember ember_warnings)
set(EMBER_EXPECT_FAILURE ${CMAKE_CURRENT_SOURCE_DIR}/dist/expect_failure.sh)
add_test(NAME dist_mpi_failure_skip
  COMMAND ${EMBER_EXPECT_FAILURE} 60 "allreduce #2 on rank 0 timed out after 2000 ms"
    ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:ember_dist_failure> skip)
add_test(NAME dist_mpi_failure_exit
  COMMAND ${EMBER_EXPECT_FAILURE} 60 "exit code|exited|timed out"
    ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:ember_dist_failure> exit)
add_test(NAME dist_mpi_failure_queued
  COMMAND ${EMBER_EXPECT_FAILURE} 60 "rank 0: failed at once"
    ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:ember_dist_failure> queued)
add_test(NAME dist_mpi_failure_unwaited
  COMMAND ${EMBER_EXPECT_FAILURE} 60 "allreduce #2 on rank 0 timed out after 2000 ms"
    ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:ember_dist_failure> unwaited)
add_test(NAME dist_mpi_failure_local
  COMMAND ${EMBER_EXPECT_FAILURE} 60
    "rank 1: refused: allreduce #2: rank 1: the process group cannot be used after an earlier failure: recv #1 on rank 1"
    ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:ember_dist_failure> local)
# A collective that fails inside the user's try: its message reaches stderr although the
# broken group ends the job (with the default group, or with a group destroyed by unwinding).
foreach(mode caught unwound)
  add_test(NAME dist_mpi_failure_${mode}
    COMMAND ${EMBER_EXPECT_FAILURE} 60 "barrier #1 on rank 1 timed out after 3000 ms"
      ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:ember_dist_failure> ${mode})
endforeach()
# A collective save_checkpoint on rank 0 alone (the tutorial's `if rank == 0` guard) while
# rank 1 all-reduces: both ranks name both calls at once (the fingerprints every rank
# exchanges before each collective). The group's timeout is 10 s: a regression shows.
add_test(NAME dist_mpi_failure_save_alone
  COMMAND ${EMBER_EXPECT_FAILURE} 30
    "rank 0: failed within 5 s .*rank 0 issued allgather #2 .*; rank 1 issued allreduce #2"
    --and "rank 1: failed within 5 s .*rank 0 issued allgather #2 .*; rank 1 issued allreduce #2"
    ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:ember_dist_failure> save_alone)
set_tests_properties(dist_mpi_failure_skip dist_mpi_failure_exit dist_mpi_failure_queued
  dist_mpi_failure_unwaited dist_mpi_failure_local dist_mpi_failure_caught
  dist_mpi_failure_unwound dist_mpi_failure_save_alone
  PROPERTIES TIMEOUT 120 LABELS "dist;mpi" PROCESSORS 2)

# The last of NP ranks differs at collective #2 (failure_main.cpp's other_op, other_count,
# skip_next, and leave, leave_exit and leave_unwind) on BACKEND, launched by LAUNCH...: every rank that waits fails within 5 s with the
# same message, naming the ranks, the numbers and the calls; the groups' timeout is 60 s.
function(ember_add_odd_one_out prefix np backend)
  math(EXPR last "${np} - 1")
  if(np EQUAL 2)
    set(others "rank 0")
  else()
    set(others "ranks 0, 1")
  endif()
  set(differ "the ranks issued different collectives: ${others} issued allreduce #2 on f32 .1024. .sum.. rank ${last} issued")
  set(expect_other_op "${differ} broadcast #2 on f32 .1024. .root 0.")
  set(expect_other_count "${differ} allreduce #2 on f32 .512. .sum.")
  set(expect_skip_next "${differ} barrier #2")
  set(expect_leave "rank ${last} left the group after allreduce #1 .destroy_process_group.*while ${others} waited in allgather #2")
  set(expect_leave_exit "${expect_leave}")
  set(expect_leave_unwind "${expect_leave}")
  foreach(mode other_op other_count skip_next leave leave_exit leave_unwind)
    set(waiting ${np})
    if(mode MATCHES "^leave")
      set(waiting ${last})
    endif()
    set(ands)
    math(EXPR top "${waiting} - 1")
    foreach(r RANGE ${top})
      list(APPEND ands --and "rank ${r}: failed within 5 s .*${expect_${mode}}")
    endforeach()
    add_test(NAME ${prefix}_${mode}_np${np}
      COMMAND ${EMBER_EXPECT_FAILURE} 30 "rank 0: failed within 5 s" ${ands} ${ARGN} ${mode} ${backend})
    set_tests_properties(${prefix}_${mode}_np${np} PROPERTIES TIMEOUT 120 PROCESSORS ${np}
                                                             LABELS "dist")
  endforeach()
endfunction()
foreach(np 2 3)
  ember_add_odd_one_out(dist_mpi_failure ${np} mpi
    ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:ember_dist_failure>)
endforeach()

# The dumps of an mpirun job whose last rank left while the others wait in save_checkpoint,
# read by ember-flight: the waiting ranks' records say where they are (the leaver's group is
# gone with its records, and the error names it).
add_test(NAME dist_mpi_flight_leave
  COMMAND ${EMBER_EXPECT_FAILURE} 60
    "every rank that dumped completed allreduce #1"
    --and "rank 0 waits in allgather #2 .save_checkpoint, i64 x 2, 16 B. since"
    --and "rank 2 left no dump"
    bash ${CMAKE_CURRENT_LIST_DIR}/flight_job.sh ${CMAKE_CURRENT_BINARY_DIR}/flight_leave
    $<TARGET_FILE:ember-flight>
    ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} 3 $<TARGET_FILE:ember_dist_failure> leave)
set_tests_properties(dist_mpi_flight_leave PROPERTIES TIMEOUT 120 LABELS "dist;mpi" PROCESSORS 3)

# The same suite and failures on the TCP backend, launched torchrun-style without mpirun.
include(${CMAKE_CURRENT_LIST_DIR}/tcp_tests.cmake)

# The store of an mpirun job (detail::mpi_job_store: the MPI backend's, and NCCL's side channel
# under mpirun) at 2 and 3 ranks: the check NCCL runs over it names a planted mismatch and ranks
# that left while rank 0 waits within seconds (mpi_job_store_test.cpp). Then rank 1 hangs in
# its own code (failure_main skip) while the others time out in allreduce #2, each rank
# writing to a folder of its own: rank 0's folder holds every rank's dump afterwards, the hung
# rank's included, gathered over the store, and ember-flight's paragraph there names rank 1.
foreach(np 2 3)
  add_test(NAME dist_mpi_job_store_np${np}
    COMMAND ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:ember_dist_tests>
            --gtest_filter=MpiJobStore.*)
  set(holds)
  math(EXPR top "${np} - 1")
  foreach(r RANGE ${top})
    list(APPEND holds --and "r0 holds rank${r}.json")
  endforeach()
  if(np EQUAL 2)
    set(waiting "rank 0 issued allreduce #2 .f32 x 1024, 4.0 KiB.. rank 1 never issued #2")
  else()
    set(waiting "ranks 0, 2 issued allreduce #2 .f32 x 1024, 4.0 KiB.. rank 1 never issued #2")
  endif()
  add_test(NAME dist_mpi_flight_gather_np${np}
    COMMAND ${EMBER_EXPECT_FAILURE} 60 "r1 holds rank1.json" ${holds}
      --and "The ranks disagree at #2: ${waiting}"
      --and "rank 1 is outside any collective: its last, allreduce #1 .f32 x 1024, 4.0 KiB., completed"
      bash ${CMAKE_CURRENT_LIST_DIR}/mpi_flight_gather.sh
      ${CMAKE_CURRENT_BINARY_DIR}/flight_gather_np${np} $<TARGET_FILE:ember-flight> ${np}
      ${EMBER_MPIRUN} ${MPIEXEC_NUMPROC_FLAG} ${np} -- $<TARGET_FILE:ember_dist_failure> skip)
  set_tests_properties(dist_mpi_job_store_np${np} dist_mpi_flight_gather_np${np} PROPERTIES
                       TIMEOUT 120 LABELS "dist;mpi" PROCESSORS ${np})
endforeach()
