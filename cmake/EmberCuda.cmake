# The CUDA backend is compiled where it will run, or where asked (EMBER_CUDA):
#   AUTO  when a GPU is visible (nvidia-smi lists one) and a CUDA toolkit is found, or when
#         architectures are asked for (EMBER_CUDA_ARCHITECTURES or CMAKE_CUDA_ARCHITECTURES
#         given): a CPU-only machine never waits for nvcc, even with a toolkit installed
#   ON    always, a toolkit required (scripts/test.sh and CI: it keeps compiling everywhere)
#   OFF   never
# The architectures: CMAKE_CUDA_ARCHITECTURES when given, else EMBER_CUDA_ARCHITECTURES, else
# the visible GPUs' own, else 80;90 (A100 and H100).
include(CheckLanguage)

# The compute capabilities of the GPUs nvidia-smi lists ("9.0" -> 90), or "native" (nvcc's
# own detection) where the driver is too old to report them; empty where none is visible.
function(ember_visible_gpu_architectures out)
  set(archs "")
  find_program(EMBER_NVIDIA_SMI nvidia-smi)
  mark_as_advanced(EMBER_NVIDIA_SMI)
  if(EMBER_NVIDIA_SMI)
    execute_process(COMMAND ${EMBER_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
      RESULT_VARIABLE rc OUTPUT_VARIABLE caps ERROR_QUIET TIMEOUT 30)
    if(rc EQUAL 0)
      string(REGEX MATCHALL "[0-9]+\\.[0-9]+" caps "${caps}")
      foreach(cap IN LISTS caps)
        string(REPLACE "." "" cap "${cap}")
        list(APPEND archs ${cap})
      endforeach()
      list(REMOVE_DUPLICATES archs)
    else()
      execute_process(COMMAND ${EMBER_NVIDIA_SMI} -L RESULT_VARIABLE rc OUTPUT_VARIABLE gpus
        ERROR_QUIET TIMEOUT 30)
      if(rc EQUAL 0 AND gpus MATCHES "GPU [0-9]+:")
        set(archs native)
      endif()
    endif()
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# Architectures asked for: CMAKE_CUDA_ARCHITECTURES (or CMake's CUDAARCHS environment
# variable), else EMBER_CUDA_ARCHITECTURES.
if(DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(ember_cuda_asked_archs "${CMAKE_CUDA_ARCHITECTURES}")
elseif(NOT "$ENV{CUDAARCHS}" STREQUAL "")
  set(ember_cuda_asked_archs "$ENV{CUDAARCHS}")
else()
  set(ember_cuda_asked_archs "${EMBER_CUDA_ARCHITECTURES}")
endif()
set(ember_visible_archs "")
if(NOT EMBER_CUDA STREQUAL "OFF")
  ember_visible_gpu_architectures(ember_visible_archs)
endif()

# Whether to compile it, and why (configure prints the reason either way).
set(EMBER_WITH_CUDA OFF)
set(ember_cuda_wanted ON)
if(EMBER_CUDA STREQUAL "OFF")
  set(ember_cuda_wanted OFF)
  set(ember_cuda_why "EMBER_CUDA=OFF")
elseif(EMBER_CUDA STREQUAL "ON")
  set(ember_cuda_why "EMBER_CUDA=ON")
elseif(NOT ember_cuda_asked_archs STREQUAL "")
  set(ember_cuda_why "EMBER_CUDA=AUTO and architectures ${ember_cuda_asked_archs} asked for")
elseif(NOT ember_visible_archs STREQUAL "")
  set(ember_cuda_why "EMBER_CUDA=AUTO and a GPU is visible")
elseif(EMBER_CUDA STREQUAL "AUTO")
  set(ember_cuda_wanted OFF)
  set(ember_cuda_why "EMBER_CUDA=AUTO and no GPU visible (nvidia-smi lists none); \
-DEMBER_CUDA=ON or -DEMBER_CUDA_ARCHITECTURES=<list> compiles it anyway")
else()
  message(FATAL_ERROR "ember: EMBER_CUDA=${EMBER_CUDA}: expected AUTO, ON or OFF")
endif()

if(ember_cuda_wanted)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(EMBER_WITH_CUDA ON)
  elseif(EMBER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ember: EMBER_CUDA=ON but no CUDA compiler was found: set "
      "CMAKE_CUDA_COMPILER, or build CPU only with -DEMBER_CUDA=OFF (the scripts: "
      "EMBER_CMAKE_ARGS=-DEMBER_CUDA=OFF)")
  else()
    string(APPEND ember_cuda_why ", but no CUDA toolkit was found (no nvcc)")
  endif()
endif()

if(NOT EMBER_WITH_CUDA)
  message(STATUS "ember: CUDA backend off: ${ember_cuda_why}")
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  if(NOT ember_cuda_asked_archs STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES ${ember_cuda_asked_archs})
  elseif(NOT ember_visible_archs STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES ${ember_visible_archs})
  else()
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
endif()
enable_language(CUDA)
# CMake 3.25 knows no C++20 dialect flag for nvcc (3.26 does): teach it, then ask for C++20.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# Debian 12's CMake 3.25.1 marks CUDA::nvToolsExt deprecated whenever the project asks for
# 3.25 or later, without checking that the toolkit has it: CUDA 13 has not, and configure
# fails ("set_property could not find TARGET CUDA::nvToolsExt"). Its finder is asked as a 3.24
# project would ask it (nvtx3 is found the same; ember links neither).
set(ember_minimum_required ${CMAKE_MINIMUM_REQUIRED_VERSION})
set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_MINIMUM_REQUIRED_VERSION ${ember_minimum_required})

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
message(STATUS "ember: CUDA backend on: ${ember_cuda_why} (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
  "architectures ${CMAKE_CUDA_ARCHITECTURES})")
