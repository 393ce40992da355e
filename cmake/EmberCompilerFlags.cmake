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

# AddressSanitizer + UndefinedBehaviorSanitizer for every target (scripts/test.sh --sanitize):
# a memory error or undefined behaviour aborts the program instead of being reported and
# carried on from. Host code only; configure with -DEMBER_CUDA=OFF.
option(EMBER_SANITIZE "Build with -fsanitize=address,undefined (host code; pair with EMBER_CUDA=OFF)" OFF)
if(EMBER_SANITIZE)
  if(NOT EMBER_CUDA STREQUAL "OFF")
    message(FATAL_ERROR "EMBER_SANITIZE=ON needs -DEMBER_CUDA=OFF (nvcc-built code is not instrumented)")
  endif()
  set(EMBER_SANITIZE_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer
                           -fno-sanitize-recover=undefined)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${EMBER_SANITIZE_FLAGS}>")
  add_link_options(${EMBER_SANITIZE_FLAGS})
endif()
