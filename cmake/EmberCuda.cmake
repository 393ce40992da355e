# The CUDA backend: on whenever a CUDA toolkit is found (EMBER_CUDA=AUTO), forced with ON.
include(CheckLanguage)
set(EMBER_WITH_CUDA OFF)
if(NOT EMBER_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(EMBER_WITH_CUDA ON)
  elseif(EMBER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "EMBER_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()

if(NOT EMBER_WITH_CUDA)
  message(STATUS "ember: CUDA backend off")
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES ${EMBER_CUDA_ARCHITECTURES})
endif()
enable_language(CUDA)
# CMake 3.25 knows no C++20 dialect flag for nvcc (3.26 does): teach it, then ask for C++20.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
find_package(CUDAToolkit REQUIRED)

# cuDNN and NCCL: system install, the toolkit folder, or a pip wheel's folder given by
# EMBER_CUDNN_ROOT / EMBER_NCCL_ROOT (or the CUDNN_ROOT / NCCL_ROOT environment variables).
# Wheels ship only versioned libraries (libcudnn.so.9), so those names are searched too.
function(ember_find_vendor_library prefix header libname soversion root)
  set(names NAMES ${libname} lib${libname}.so.${soversion} NAMES_PER_DIR)
  set(suffixes lib lib64 lib/x86_64-linux-gnu)
  # The CMake variable wins over the environment: one root, so one install.
  set(given ${root})
  if(NOT given AND NOT "$ENV{${prefix}_ROOT}" STREQUAL "")
    # Kept like a -D root, so CMake re-run by the build without the variable keeps it too.
    set(given $ENV{${prefix}_ROOT})
    set(EMBER_${prefix}_ROOT "${given}" CACHE PATH "Where ${prefix} lives (from ${prefix}_ROOT)"
      FORCE)
  endif()
  # What an earlier configure found under another root (or none) is searched for again.
  if(NOT "${given}" STREQUAL "${EMBER_${prefix}_SEARCHED_ROOT}")
    unset(EMBER_${prefix}_INCLUDE_DIR CACHE)
    unset(EMBER_${prefix}_LIBRARY CACHE)
  endif()
  set(EMBER_${prefix}_SEARCHED_ROOT "${given}" CACHE INTERNAL "the root the cached paths are from")
  if(given)
    # A root given (a wheel's folder) is searched alone, so it wins over any other copy and the
    # header and library come from one install.
    find_path(EMBER_${prefix}_INCLUDE_DIR ${header} PATHS ${given} PATH_SUFFIXES include
      NO_DEFAULT_PATH)
    find_library(EMBER_${prefix}_LIBRARY ${names} PATHS ${given} PATH_SUFFIXES ${suffixes}
      NO_DEFAULT_PATH)
    if(NOT EMBER_${prefix}_INCLUDE_DIR OR NOT EMBER_${prefix}_LIBRARY)
      message(FATAL_ERROR "ember: ${prefix}_ROOT ${given} holds no include/${header} with "
        "lib${libname}.so or lib${libname}.so.${soversion} beside it")
    endif()
  else()
    set(hints ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda /usr)
    find_path(EMBER_${prefix}_INCLUDE_DIR ${header} HINTS ${hints} PATH_SUFFIXES include)
    find_library(EMBER_${prefix}_LIBRARY ${names} HINTS ${hints} PATH_SUFFIXES ${suffixes})
  endif()
  if(EMBER_${prefix}_INCLUDE_DIR AND EMBER_${prefix}_LIBRARY)
    string(TOLOWER ${prefix} lower)
    add_library(ember_${lower} INTERFACE)
    target_include_directories(ember_${lower} SYSTEM INTERFACE ${EMBER_${prefix}_INCLUDE_DIR})
    target_link_libraries(ember_${lower} INTERFACE ${EMBER_${prefix}_LIBRARY})
    message(STATUS "ember: ${prefix} ${EMBER_${prefix}_LIBRARY}")
  else()
    message(FATAL_ERROR "ember: ${prefix} not found with the CUDA backend on; "
      "pass -DEMBER_${prefix}_ROOT=<folder with include/ and lib/>")
  endif()
endfunction()
ember_find_vendor_library(CUDNN cudnn.h cudnn 9 "${EMBER_CUDNN_ROOT}")
ember_find_vendor_library(NCCL nccl.h nccl 2 "${EMBER_NCCL_ROOT}")
message(STATUS "ember: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
