# An op whose descriptor lacks a piece does not compile: each case compiles
# op_def_incomplete.cpp with one piece left out and passes only when the compiler rejects it
# for that piece's reason; the control (nothing left out) must compile.
set(op_def_source ${CMAKE_CURRENT_LIST_DIR}/op_def_incomplete.cpp)
set(op_def_compile ${CMAKE_CXX_COMPILER} -std=c++20 -fsyntax-only -I${EMBER_INCLUDE_DIR})
add_test(NAME op_def_compile_control COMMAND ${op_def_compile} ${op_def_source})
foreach(case_and_reason
    "BACKWARD|differentiable_op_without_backward"
    "KERNELS|too few arguments to function|no matching function"
    "NODE_NAME|node_name_not_ending_in_Backward"
    "DESCRIPTOR|kUndefinedOp")
  string(REPLACE "|" ";" parts "${case_and_reason}")
  list(POP_FRONT parts case)
  add_test(NAME op_def_compile_without_${case}
           COMMAND ${op_def_compile} -DEMBER_OMIT_${case} ${op_def_source})
  set_tests_properties(op_def_compile_without_${case} PROPERTIES
                       PASS_REGULAR_EXPRESSION "${parts}" LABELS tensor)
endforeach()
set_tests_properties(op_def_compile_control PROPERTIES LABELS tensor)

# op_def_test.cpp reads README.md's autocast table.
target_compile_definitions(ember_tensor_tests PRIVATE EMBER_README="${PROJECT_SOURCE_DIR}/README.md")
