# Debian packages from the build folder:  cd build && cpack -G DEB
#   ember_VERSION_ARCH.deb      the shared libraries, ember-train and ember-run (component runtime)
#   ember-dev_VERSION_ARCH.deb  headers, CMake package files and ember.pc (component dev)
# for /usr. The runtime package's Depends come from dpkg-shlibdeps (the Debian packages of the
# libraries the binaries link); libraries from outside Debian's packages (a CUDA toolkit from
# NVIDIA's installer or pip wheels) get no entry there. Its shlibs file lets packages built
# against ember depend on it in turn.
include(GNUInstallDirs)

set(EMBER_DEB_MAINTAINER "ember developers <ember-dev@example.org>" CACHE STRING
    "Maintainer field of the Debian packages (name <address>)")
set(EMBER_DEB_RUNTIME_NAME ember)
set(EMBER_DEB_DEV_NAME ember-dev)

# Every Debian package carries a copyright file and a changelog in /usr/share/doc/<package>/.
set(EMBER_DEB_DOC_DIR ${CMAKE_CURRENT_BINARY_DIR}/deb-doc)
if(DEFINED ENV{SOURCE_DATE_EPOCH})
  string(TIMESTAMP EMBER_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
else()
  # The date of the commit built, so that the packages do not change with the day of the build.
  execute_process(COMMAND git -C ${CMAKE_CURRENT_SOURCE_DIR} log -1 --format=%cD
                  OUTPUT_VARIABLE EMBER_DEB_DATE OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET RESULT_VARIABLE git_result)
  if(NOT git_result EQUAL 0 OR EMBER_DEB_DATE STREQUAL "")
    string(TIMESTAMP EMBER_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
  endif()
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/changelog.in ${EMBER_DEB_DOC_DIR}/changelog @ONLY)
execute_process(COMMAND gzip -9 -n -c ${EMBER_DEB_DOC_DIR}/changelog
                OUTPUT_FILE ${EMBER_DEB_DOC_DIR}/changelog.gz RESULT_VARIABLE gzip_result)
if(NOT gzip_result EQUAL 0)
  message(FATAL_ERROR "ember: gzip failed on ${EMBER_DEB_DOC_DIR}/changelog")
endif()
foreach(component runtime dev)
  string(TOUPPER ${component} upper)
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/debian/copyright ${EMBER_DEB_DOC_DIR}/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${EMBER_DEB_${upper}_NAME}
          COMPONENT ${component})
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ${EMBER_DEB_RUNTIME_NAME})
set(CPACK_PACKAGE_VENDOR "ember developers")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# Each package's description below starts with its own summary line; CPack prepends the
# summary only when it differs from CPack's default, so it is left at that default.
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${CMAKE_PROJECT_NAME} built using CMake")
set(CPACK_PACKAGE_CONTACT ${EMBER_DEB_MAINTAINER})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENT_DEV_DEPENDS runtime)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER ${EMBER_DEB_MAINTAINER})
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ${EMBER_DEB_RUNTIME_NAME})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION science)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
# The shared libraries go to /usr/lib: dpkg runs ldconfig once after installing them.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/debian/triggers)
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
    "C++20 deep-learning framework (libraries, ember-train and ember-run)
ember has tensors on the CPU and CUDA, reverse-mode autograd, neural-network
layers and ResNets, optimizers, data loading and distributed data-parallel
training over MPI, NCCL or TCP, following PyTorch's definitions.
.
This package holds ember's shared libraries, ember-train, which trains
a ResNet on CIFAR or (Fashion-)MNIST alone or under mpirun, and ember-run,
which starts a program's distributed workers (like torchrun).")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME ${EMBER_DEB_DEV_NAME})
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# What a program built against ember needs besides ember itself: Ember::dist (and ember.pc)
# link MPI, which EmberConfig.cmake finds.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libopenmpi-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SUGGESTS "cmake, pkg-config")
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "C++20 deep-learning framework (development files)
ember has tensors on the CPU and CUDA, reverse-mode autograd, neural-network
layers and ResNets, optimizers, data loading and distributed data-parallel
training over MPI, NCCL or TCP, following PyTorch's definitions.
.
This package holds the headers, the CMake package (find_package(Ember)) and
ember.pc for pkg-config.")

include(CPack)
