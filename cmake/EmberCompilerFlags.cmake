# Warnings every ember target is built with; CI turns them into errors.
add_library(ember_warnings INTERFACE)
target_compile_options(ember_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unknown-pragmas>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${EMBER_WARNINGS_AS_ERRORS}>>:-Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${EMBER_WARNINGS_AS_ERRORS}>>:-Werror=all-warnings>)

find_program(EMBER_CCACHE ccache)
if(EMBER_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${EMBER_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${EMBER_CCACHE})
endif()
