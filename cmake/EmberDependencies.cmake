# CPU dependencies, all from Debian packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)

# OpenBLAS: prefer the pthread flavour's cblas.h, which Debian ships under openblas-pthread/.
find_path(EMBER_CBLAS_INCLUDE_DIR cblas.h
  PATH_SUFFIXES openblas-pthread openblas x86_64-linux-gnu/openblas-pthread
  HINTS /usr/include/x86_64-linux-gnu)
find_library(EMBER_OPENBLAS_LIBRARY NAMES openblas
  PATH_SUFFIXES openblas-pthread
  HINTS /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/openblas-pthread)
if(NOT EMBER_CBLAS_INCLUDE_DIR OR NOT EMBER_OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS not found: run scripts/setup.sh (apt-get install libopenblas-dev)")
endif()
add_library(ember_openblas INTERFACE)
target_include_directories(ember_openblas SYSTEM INTERFACE ${EMBER_CBLAS_INCLUDE_DIR})
target_link_libraries(ember_openblas INTERFACE ${EMBER_OPENBLAS_LIBRARY})
message(STATUS "ember: OpenBLAS ${EMBER_OPENBLAS_LIBRARY} (cblas.h in ${EMBER_CBLAS_INCLUDE_DIR})")
